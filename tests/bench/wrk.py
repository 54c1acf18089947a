"""The load generator: Debian's wrk, one thread, a Lua script for the POST.

wrk is the same client for every subject, so client cost cancels out of the ratios.
The script sets method, body and headers, and its `done` hook writes the summary as
JSON (requests, errors by kind, latency percentiles in µs) so nothing parses wrk's
human output. wrk counts a streamed answer as one request, finished at its last
byte; `errors.status` counts answers with status >= 400.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from tests.bench.procs import pinned

WRK = "/usr/bin/wrk"

_DONE = """
done = function(summary, latency, requests)
  local e = summary.errors
  local f = assert(io.open(%s, "w"))
  f:write(string.format(
    '{"requests":%%d,"duration_us":%%d,"bytes":%%d,"connect":%%d,"read":%%d,' ..
    '"write":%%d,"status":%%d,"timeout":%%d,"p50_us":%%d,"p90_us":%%d,"p99_us":%%d,' ..
    '"mean_us":%%.1f,"max_us":%%d}',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write,
    e.status, e.timeout, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.mean, latency.max))
  f:close()
end
"""


def _lua_string(text: str) -> str:
    return json.dumps(text)  # a JSON string literal is a valid Lua string literal here


def script(body: str, headers: dict[str, str], out: Path) -> str:
    lines = ['wrk.method = "POST"', f"wrk.body = {_lua_string(body)}"]
    lines += [f"wrk.headers[{_lua_string(k)}] = {_lua_string(v)}" for k, v in headers.items()]
    return "\n".join(lines) + "\n" + _DONE % _lua_string(str(out))


@dataclass
class WrkResult:
    requests: int
    duration_us: int
    bytes: int
    connect: int
    read: int
    write: int
    status: int
    timeout: int
    p50_us: int
    p90_us: int
    p99_us: int
    mean_us: float
    max_us: int

    @property
    def rps(self) -> float:
        return self.requests / (self.duration_us / 1e6) if self.duration_us else 0.0

    @property
    def errors(self) -> int:
        return self.connect + self.read + self.write + self.status + self.timeout

    @property
    def ok(self) -> int:
        return max(0, self.requests - self.status)

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "rps": round(self.rps, 1), "errors": self.errors}


def run(
    url: str,
    body: str,
    headers: dict[str, str],
    *,
    connections: int,
    seconds: float,
    workdir: Path,
    cpus: str | None,
    timeout_s: float = 10.0,
) -> WrkResult:
    """One wrk run; `-t1` so the generator's cost is one core at most."""
    out = workdir / "wrk-out.json"
    out.unlink(missing_ok=True)
    lua = workdir / "wrk.lua"
    lua.write_text(script(body, headers, out))
    cmd = [
        WRK,
        "-t1",
        f"-c{connections}",
        f"-d{max(1, round(seconds))}s",
        f"--timeout={timeout_s:g}s",
        "-s",
        str(lua),
        url,
    ]
    done = subprocess.run(
        pinned(cmd, cpus), capture_output=True, text=True, timeout=seconds + timeout_s + 30
    )
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stderr or done.stdout}")
    return WrkResult(**json.loads(out.read_text()))
