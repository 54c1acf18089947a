"""What `make demo` prints: the snippets (each runs as printed from the directory the
demo was started in; the tests run every one), the status page's address, and the
`TOKENGATE_*` variables of the user's shell that it honours.

The agents' lines are docs/agents.md's "Coding agents" recipes pointed at the demo: Claude
Code with the gateway as `ANTHROPIC_BASE_URL`, Codex with a `config.toml` of its own
under `var/demo-codex` (the user's `~/.codex` is left alone). Their prompts name a tool,
as a user asks an agent to act: the demo's simulator, like a real model, calls a tool
only when a request asks for one (`tokengate sim --tool-calls named`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from app.log import redacted_url

ROOT = Path(__file__).resolve().parents[2]  # the repository
CLAUDE = ROOT / ".cache/claude-code/node_modules/.bin/claude"
CODEX = ROOT / ".cache/npm/node_modules/.bin/codex"
MODEL = "claude-sonnet"  # the seed's default route; the sim serves it
_SECRET_WORDS = ("KEY", "PASSWORD", "SECRET", "HEADERS")


def _command(path: Path) -> str:
    """`path` as a shell word that works from the directory the demo was started in:
    relative under `make demo` (printed whether or not it is installed yet)."""
    relative = os.path.relpath(path, os.getcwd())
    return relative if not relative.startswith("..") else str(path)


def codex_config(base: str) -> str:
    """docs/agents.md's Codex `config.toml`, pointed at the demo gateway (no blank line: a
    snippet ends at one)."""
    return (
        f'model = "{MODEL}"\n'
        'model_provider = "tokengate"\n'
        'web_search = "disabled"\n'
        "[features]\nplugins = false\nunbounded_connection_retries = false\n"
        "[analytics]\nenabled = false\n"
        "[model_providers.tokengate]\n"
        'name = "tokengate"\n'
        f'base_url = "{base}/v1"\n'
        'env_key = "TOKENGATE_API_KEY"\n'
        'wire_api = "responses"\n'
        "supports_websockets = true\n"
    )


def agents(base: str, key: str) -> list[tuple[str, str]]:
    claude, codex = _command(CLAUDE), _command(CODEX)
    return [
        (
            "Claude Code (`make claude-code` installs it): it reads a file with its Read tool",
            f"ANTHROPIC_BASE_URL={base} ANTHROPIC_API_KEY={key} "
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 \\\n"
            f'  {claude} -p "Use Read on $PWD/README.md and say what it is"',
        ),
        (
            "Codex CLI (`make codex-cli` installs it): its own config, it runs a command",
            "mkdir -p var/demo-codex && cat > var/demo-codex/config.toml <<'TOML'\n"
            f"{codex_config(base)}"
            "TOML\n"
            f"CODEX_HOME=$PWD/var/demo-codex TOKENGATE_API_KEY={key} \\\n"
            f'  {codex} exec "Use exec_command to say hello"',
        ),
    ]


def snippets(base: str, key: str) -> list[tuple[str, str]]:
    """(title, shell text) of each snippet, ready to paste; the tests run each one."""
    python = _command(Path(sys.executable).parent / "python")
    tokengate = _command(Path(sys.executable).parent / "tokengate")
    ping = '[{"role": "user", "content": "ping"}]'
    return [
        (
            "a chat completion with curl",
            f"curl {base}/v1/chat/completions \\\n"
            f'  -H "Authorization: Bearer {key}" -H "Content-Type: application/json" \\\n'
            f'  -d \'{{"model": "{MODEL}", "max_tokens": 8, "messages": {ping}}}\'',
        ),
        (
            "the OpenAI SDK",
            f"{python} - <<'PY'\n"
            "from openai import OpenAI\n"
            f'client = OpenAI(base_url="{base}/v1", api_key="{key}")\n'
            f'r = client.chat.completions.create(model="{MODEL}", max_tokens=8,\n'
            f"        messages={ping})\n"
            "print(r.choices[0].message.content, r.usage)\n"
            "PY",
        ),
        (
            "the Anthropic SDK (POST /v1/messages, the same domain)",
            f"{python} - <<'PY'\n"
            "from anthropic import Anthropic\n"
            f'client = Anthropic(base_url="{base}", api_key="{key}")\n'
            f'm = client.messages.create(model="{MODEL}", max_tokens=8,\n'
            f"        messages={ping})\n"
            "print(m.content[0].text, m.usage)\n"
            "PY",
        ),
        (
            "an agent's round trip: asked to, the model calls a tool; the agent sends its result",
            f"{python} - <<'PY'\n"
            "from openai import OpenAI\n"
            f'client = OpenAI(base_url="{base}/v1", api_key="{key}")\n'
            'tools = [{"type": "function", "function": {"name": "get_time",\n'
            '          "description": "The current UTC time", "parameters": {"type": "object",\n'
            '          "properties": {"zone": {"type": "string"}}}}}]\n'
            'messages = [{"role": "user", "content": "What time is it? Use get_time."}]\n'
            f'r = client.chat.completions.create(model="{MODEL}", max_tokens=64,\n'
            "        messages=messages, tools=tools)\n"
            "asked = r.choices[0].message\n"
            "if asked.tool_calls:  # run each tool asked for, send the results back\n"
            "    messages.append(asked.model_dump(exclude_none=True))\n"
            "    for call in asked.tool_calls:\n"
            '        print("tool call:", call.function.name, call.function.arguments)\n'
            '        result = {"role": "tool", "tool_call_id": call.id, "content": "12:00"}\n'
            "        messages.append(result)\n"
            f'    r = client.chat.completions.create(model="{MODEL}", max_tokens=64,\n'
            "            messages=messages, tools=tools)\n"
            'print("answer:", r.choices[0].message.content)\n'
            "PY",
        ),
        *agents(base, key),
        ("readiness: every domain's state", f"curl {base}/health/ready"),
        ("metrics", f"curl -s {base}/metrics | grep '^tokengate_requests_total'"),
        (
            "the whole chain verified: models, a ping, 16 concurrent probes",
            f"TOKENGATE_API_KEY={key} {tokengate} check --target {base}",
        ),
    ]


def shown(name: str, value: str) -> str:
    """A variable's value fit for the terminal: secrets hidden, URLs without passwords."""
    if any(word in name.upper().removeprefix("TOKENGATE_") for word in _SECRET_WORDS):
        return "***"
    return redacted_url(value) if "://" in value else value


def page(base: str, admin_key: str | None) -> str:
    """Where the status page is, and the key that opens it."""
    if admin_key is None:
        return f"Status page: {base}/ui (enter the admin key you set in TOKENGATE_ADMIN_KEY)"
    return f"Status page: {base}/ui (enter the demo's admin key: {admin_key})"


def honoured(user: dict[str, str]) -> str:
    """The user's own `TOKENGATE_*` variables, which win over the demo's defaults."""
    if not user:
        return (
            "Your shell sets no TOKENGATE_* variable: the demo's defaults apply "
            "(set any, e.g. TOKENGATE_RATE_LIMIT__REQUESTS_PER_MINUTE=60 make demo; "
            "they win)."
        )
    lines = [f"  {name}={shown(name, value)}" for name, value in sorted(user.items())]
    return "Your TOKENGATE_* variables, in force over the demo's defaults:\n" + "\n".join(lines)
