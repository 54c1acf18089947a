"""Deterministic tool calls, so an agent's round trip can be tried against the simulator.

A request that offers tools (and does not say `tool_choice: none`) gets a call of one of
them, unless its last message already carries a tool's result: then it gets a text
answer, so every round trip ends in two requests. That is `--tool-calls auto`, the
default. `--tool-calls named` calls a tool only when the request demands one
(`tool_choice` required / any / a named tool) or the user's last text names one ("Use
Read on /tmp/x", "call get_weather"): agents send their whole tool set with every
request (Claude Code a dozen tools even for "say hi"), and answering each with a call
sends them down sub-tasks, which a test of one prompt does not want.
Which tool, and with which arguments, depends only on the request:

- the tool the request forces, else the first tool whose name appears as a word (same
  case) in the user's last text, else the first tool;
- arguments from the tool's JSON schema: each required property gets a value of its
  type (an `enum`'s first value; for a string named like a path or file, the first
  absolute path in the last user text, so `Read /tmp/x/hello.txt` reads that file).

The dialect modules (chat, messages, responses) only say where the tools, the choice
and the messages are; this module decides.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from app.sim import text

ToolMode = Literal["auto", "named"]
_PATH = re.compile(r"(?<![\w/])/[\w.\-/]+[\w/]")
_WORD = re.compile(r"[A-Za-z_][\w-]*")


@dataclass(frozen=True)
class Tool:
    name: str
    schema: dict[str, Any]


@dataclass(frozen=True)
class ToolCall:
    ident: str
    name: str
    arguments: dict[str, Any]

    @property
    def arguments_json(self) -> str:
        return orjson.dumps(self.arguments).decode()


def choose(tools: Sequence[Tool], forced: str | None, prompt: str) -> ToolCall | None:
    """The call the simulator answers with; None if no tool is offered."""
    if not tools:
        return None
    by_name = {t.name: t for t in tools}
    tool = by_name.get(forced) if forced else None
    if tool is None:
        words = _WORD.findall(prompt)
        tool = next((by_name[w] for w in words if w in by_name), None)
    if tool is None:
        lowered = {t.name.lower(): t for t in tools}
        tool = next(
            (lowered[w.lower()] for w in _WORD.findall(prompt) if w.lower() in lowered), None
        )
    tool = tool or tools[0]
    arguments = _arguments(tool.schema, prompt)
    digest = hashlib.sha256(f"{tool.name}:{prompt}".encode()).hexdigest()[:24]
    return ToolCall(digest, tool.name, arguments)


def named(tools: Sequence[Tool], prompt: str) -> Tool | None:
    """The first offered tool whose name is a word of `prompt` (same case)."""
    by_name = {t.name: t for t in tools}
    return next((by_name[w] for w in _WORD.findall(prompt) if w in by_name), None)


def _arguments(schema: dict[str, Any], prompt: str) -> dict[str, Any]:
    props = schema.get("properties")
    if not isinstance(props, dict):
        return {}
    required = schema.get("required")
    names = [n for n in required if n in props] if isinstance(required, list) else []
    return {name: _value(name, props[name], prompt) for name in names}


def _value(name: str, spec: Any, prompt: str) -> Any:
    if not isinstance(spec, dict):
        return None
    enum = spec.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    kind = spec.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    if kind == "string":
        lowered = name.lower()
        if "path" in lowered or "file" in lowered:
            found = _PATH.search(prompt)
            if found:
                return found.group(0)
        return f"sim-{name}"
    if kind in ("integer", "number"):
        low = spec.get("minimum")
        return low if isinstance(low, int | float) and not isinstance(low, bool) else 1
    if kind == "boolean":
        return False
    if kind == "array":
        return []
    if kind == "object":
        return _arguments(spec, prompt)
    return None


def split_json(text: str, pieces: int = 3) -> list[str]:
    """A JSON string in a few chunks, as a model streams tool arguments."""
    size = max(1, -(-len(text) // pieces))
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def tool_call_tokens(call: ToolCall) -> int:
    """Completion tokens of a tool call, counted the simulator's way."""
    return 3 + text.count_text(call.name) + text.value_tokens(call.arguments)
