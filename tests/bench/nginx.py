"""Debian's nginx as two benchmark roles: the static upstream and the reference proxy.

The static upstream is the throughput ceiling: fixed OpenAI answers with no
Python behind them, so every subject is measured against the same, nearly free
upstream. nginx can not branch on the request body without extra modules, so it
listens twice: one port answers `POST /v1/chat/completions` with a JSON
`chat.completion`, the other with an SSE stream; subjects are started once per mode
against the matching port. Both answer `GET /v1/models` (the gateway's model
discovery and health probe).

The proxy role is "the practical limit of one proxy hop": `proxy_pass` to an
`upstream {}` with `keepalive 64`, HTTP/1.1 and `Connection ""` so upstream
connections are reused, buffering off so SSE is relayed as it arrives.

Each instance runs from its own prefix dir (pid, logs, temp paths) in the run's
temp dir, in the foreground (`daemon off`) so the benchmark owns its process group.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from tests.bench.procs import Group, Proc, pinned, wait_port

NGINX = "/usr/sbin/nginx"
MODEL = "claude-sonnet"
CREATED = 1_700_000_000


def _models_body() -> str:
    return json.dumps(
        {
            "object": "list",
            "data": [{"id": MODEL, "object": "model", "created": CREATED, "owned_by": "bench"}],
        },
        separators=(",", ":"),
    )


def _usage() -> dict[str, int]:
    return {"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8}


def completion_body() -> str:
    """A fixed non-streaming `chat.completion`, usage included."""
    return json.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": CREATED,
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "pong pong pong pong"},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": _usage(),
        },
        separators=(",", ":"),
    )


def _chunk(delta: dict[str, str], finish: str | None = None) -> dict[str, object]:
    return {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


def stream_body() -> str:
    """A fixed SSE answer: role + 4 content chunks, a finish chunk, a usage chunk, [DONE]."""
    events: list[dict[str, object]] = [_chunk({"role": "assistant", "content": ""})]
    events += [_chunk({"content": "pong "}) for _ in range(4)]
    events.append(_chunk({}, "stop"))
    events.append({**_chunk({}), "choices": [], "usage": _usage()})
    lines = [f"data: {json.dumps(e, separators=(',', ':'))}\n\n" for e in events]
    return "".join(lines) + "data: [DONE]\n\n"


def _quote(text: str) -> str:
    """An nginx single-quoted string (its parser turns `\\n` back into a newline)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


def _main(prefix: Path, workers: int, http_body: str) -> str:
    temp = "\n".join(
        f"  {kind}_temp_path {prefix}/tmp/{kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    return f"""worker_processes {workers};
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 8192; multi_accept on; }}
http {{
  access_log off;
  keepalive_requests 10000000;
  keepalive_timeout 120s;
{temp}
{http_body}
}}
"""


def _static_server(port: int, chat_type: str, chat_body: str) -> str:
    return f"""  server {{
    listen 127.0.0.1:{port} reuseport backlog=4096;
    location = /v1/models {{ default_type application/json; return 200 {_quote(_models_body())}; }}
    location = /v1/chat/completions {{
      default_type {chat_type};
      add_header Cache-Control no-cache;
      return 200 {_quote(chat_body)};
    }}
    location / {{ return 404; }}
  }}"""


def static_config(prefix: Path, json_port: int, sse_port: int) -> str:
    servers = "\n".join(
        [
            _static_server(json_port, "application/json", completion_body()),
            _static_server(sse_port, "text/event-stream", stream_body()),
        ]
    )
    return _main(prefix, 1, servers)


def proxy_config(prefix: Path, port: int, upstream_port: int) -> str:
    body = f"""  upstream backend {{
    server 127.0.0.1:{upstream_port};
    keepalive 64;
  }}
  server {{
    listen 127.0.0.1:{port} reuseport backlog=4096;
    location / {{
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}"""
    return _main(prefix, 1, body)


@dataclass
class Nginx:
    proc: Proc
    ports: tuple[int, ...]


def start(
    group: Group, name: str, prefix: Path, config: str, ports: tuple[int, ...], cpus: str | None
) -> Nginx:
    """Write `config` under `prefix` and run nginx in the foreground on it."""
    shutil.rmtree(prefix, ignore_errors=True)
    (prefix / "tmp").mkdir(parents=True)
    prefix.chmod(0o755)  # run as root, nginx's workers switch to `nobody`
    (prefix / "nginx.conf").write_text(config)
    cmd = [
        NGINX,
        "-p",
        str(prefix),
        "-e",
        str(prefix / "error.log"),
        "-c",
        str(prefix / "nginx.conf"),
        "-g",
        "daemon off;",
    ]
    proc = group.start(name, pinned(cmd, cpus))
    for port in ports:
        wait_port(port, proc)
    return Nginx(proc, ports)
