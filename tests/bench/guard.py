"""The hot path's cost guard: instructions per request under callgrind, against budgets.

    python -m tests.bench.guard              # measure, compare with budgets.toml (CI)
    python -m tests.bench.guard --update --why "what bought it"   # re-baseline

What is counted: `tokengate serve --workers 1` on the repo's config (every default
feature on: gateway-key auth, per-key limits, queue and dispatcher, metrics, the usage
ledger in SQLite, health probes) runs under `valgrind --tool=callgrind
--instr-atstart=no`; a second one shares its limits and ledger through a real
`redis-server`. Counting is switched on (`callgrind_control --instr=on`) only around a
fixed number of requests sent one after another on one keep-alive connection, after a
warm-up, so start-up, imports and caches are never counted. Scenarios:

- `chat_json`: a non-streaming chat completion (the static upstream's JSON answer);
- `chat_stream`: a streamed chat completion of 4 content events;
- `chat_stream_event`: what one more SSE event costs: (a stream of 36 content events
  minus one of 4) / 32;
- `chat_json_redis`: `chat_json` admitted through Redis (`TOKENGATE_REDIS_URL`);
- `chat_json_info`: `chat_json` at the shipped log level, `info`, so with its JSON access
  line (the other scenarios run at `warning`, as `make bench`'s `tokengate-1w` does);
- `responses_stream`: a streamed `POST /v1/responses` of 4 output_text deltas.

Determinism. The upstream is a small threaded server in this process that sends each
SSE event only once the client has received the previous one through the gateway
(lockstep), so every event is its own read and its own write whatever the timing. The
gateway's idle loops (housekeeping and the ledger flush each second, uvicorn's tick,
health probes) would otherwise land in the counted windows as often as the machine is
slow: its clock runs at 1 % speed (libfaketime, `FAKETIME="+0 x0.01"`), so they tick
once every 100 s of real time; a round they do land in comes out higher than the others
and is left out (a scenario's figure is the mean of its two lowest rounds, once these
agree within 1 %, up to `--rounds` rounds). What the gateway runs idle (instructions a
second of real time, counting on with no request) is printed beside. `PYTHONHASHSEED=0`
fixes hashing. `budgets.toml` holds the budgets; the run fails when a scenario exceeds
its budget by more than 3 %. libfaketime's own clock calls are counted too (a few
hundred instructions each): the figures are comparable with each other, not with a
gateway outside the guard.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from tests.bench import nginx, subjects
from tests.bench.procs import ROOT, Group, scratch, sigterm_as_interrupt

BUDGETS = ROOT / "tests" / "bench" / "budgets.toml"
TOLERANCE = 0.03  # over budget by more than this fails
AGREE = 0.01  # two consecutive rounds within this of each other
SHORT, LONG = 4, 36  # content events of the short and the long stream
TOKEN = "zq"  # each content delta's text: the client counts these to ack events
MODEL = nginx.MODEL
# The gateway's clock runs at 1 % speed (libfaketime): its once-a-second loops tick once
# every 100 s of real time, so almost no counted window holds one, and a window that does
# is recognised (it runs SQLite) and left out. Requests never wait on the clock.
CLOCK = "+0 x0.01"


# -- the upstream ------------------------------------------------------------------------


def _sse(obj: dict[str, object], event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return (head + "data: " + json.dumps(obj, separators=(",", ":")) + "\n\n").encode()


def _chat_chunk(delta: dict[str, str], finish: str | None = None) -> dict[str, object]:
    return {
        "id": "chatcmpl-guard",
        "object": "chat.completion.chunk",
        "created": nginx.CREATED,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


def chat_events(n: int) -> list[bytes]:
    """A chat stream as the events the upstream sends: [role + first delta], one per
    further delta, [finish + usage + [DONE]]: each group is written at once."""
    deltas = [_sse(_chat_chunk({"content": TOKEN})) for _ in range(n)]
    role = _sse(_chat_chunk({"role": "assistant", "content": ""}))
    usage = {"prompt_tokens": 4, "completion_tokens": n, "total_tokens": 4 + n}
    tail = _sse(_chat_chunk({}, "stop")) + _sse({**_chat_chunk({}), "choices": [], "usage": usage})
    return [role + deltas[0], *deltas[1:], tail + b"data: [DONE]\n\n"]


def responses_events(n: int) -> list[bytes]:
    """A Responses stream: [created + first delta], one per further delta, [completed]."""
    resp: dict[str, object] = {"id": "resp_guard", "object": "response", "model": MODEL}
    created = _sse({"type": "response.created", "response": {**resp, "status": "in_progress"}})
    at = {"item_id": "msg_guard", "output_index": 0, "content_index": 0}
    deltas = [
        _sse(
            {"type": "response.output_text.delta", **at, "delta": TOKEN},
            "response.output_text.delta",
        )
        for _ in range(n)
    ]
    usage = {"input_tokens": 4, "output_tokens": n, "total_tokens": 4 + n}
    done: dict[str, object] = {
        "type": "response.completed",
        "response": {**resp, "status": "completed", "usage": usage},
    }
    return [created + deltas[0], *deltas[1:], _sse(done, "response.completed")]


@dataclass
class Upstream:
    """A threaded HTTP/1.1 upstream with fixed answers; streams go in lockstep with `ack`."""

    server: ThreadingHTTPServer
    acks: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    stalls: int = 0  # lockstep waits that timed out (the count is then not trustworthy)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def ack(self, n: int) -> None:
        for _ in range(n):
            self.acks.release()


def start_upstream() -> Upstream:
    holder: list[Upstream] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            return None

        def do_GET(self) -> None:
            body = nginx._models_body().encode()
            self._head("application/json", len(body))
            self.wfile.write(body)

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            request = json.loads(self.rfile.read(length) or b"{}")
            n = int(request.get("max_tokens") or request.get("max_output_tokens") or SHORT)
            if self.path.endswith("/v1/responses"):
                self._stream(responses_events(n))
            elif request.get("stream"):
                self._stream(chat_events(n))
            else:
                body = nginx.completion_body().encode()
                self._head("application/json", len(body))
                self.wfile.write(body)

        def _head(self, ctype: str, length: int | None) -> None:
            self.send_response(200)
            self.send_header("content-type", ctype)
            if length is None:
                self.send_header("transfer-encoding", "chunked")
            else:
                self.send_header("content-length", str(length))
            self.end_headers()

        def _stream(self, events: list[bytes]) -> None:
            up = holder[0]
            self._head("text/event-stream", None)
            for i, event in enumerate(events):
                if i and not up.acks.acquire(timeout=60):  # the client saw the last one
                    up.stalls += 1
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    up = Upstream(server)
    holder.append(up)
    threading.Thread(target=server.serve_forever, daemon=True, name="guard-upstream").start()
    return up


# -- the client --------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    path: str
    body: dict[str, object]
    stream: bool


def scenarios(events: int) -> dict[str, Scenario]:
    messages = [{"role": "user", "content": "ping"}]
    chat: dict[str, object] = {"model": MODEL, "messages": messages, "max_tokens": 16}
    stream = {**chat, "stream": True, "max_tokens": events}
    responses = {"model": MODEL, "input": "ping", "stream": True, "max_output_tokens": events}
    return {
        "chat_json": Scenario("chat_json", "/v1/chat/completions", chat, False),
        "chat_stream": Scenario("chat_stream", "/v1/chat/completions", stream, True),
        "responses_stream": Scenario("responses_stream", "/v1/responses", responses, True),
    }


def send(client: httpx.Client, up: Upstream, s: Scenario) -> None:
    """One request; a stream is read to its end, acking each content event as it arrives."""
    if not s.stream:
        r = client.post(s.path, json=s.body)
        if r.status_code != 200:
            raise RuntimeError(f"{s.name}: {r.status_code} {r.text[:300]}")
        return
    seen = 0
    tail = b""
    with client.stream("POST", s.path, json=s.body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{s.name}: {r.status_code} {r.read()[:300]!r}")
        for chunk in r.iter_raw():
            data = tail + chunk
            count = data.count(TOKEN.encode())
            tail = data[-(len(TOKEN) - 1) :]
            count -= tail.count(TOKEN.encode())  # counted again with the next chunk
            if count:
                seen += count
                up.ack(count)
    wanted = int(str(s.body.get("max_tokens") or s.body.get("max_output_tokens") or 0))
    if seen != wanted:
        raise RuntimeError(f"{s.name}: {seen} content events arrived, {wanted} were sent")


# -- callgrind ---------------------------------------------------------------------------


class Counter:
    """Switches callgrind's counting on and off in one running gateway and reads it."""

    def __init__(self, pid: int, dump: Path) -> None:
        self.pid, self.dump = pid, dump

    def _ctl(self, *args: str) -> None:
        subprocess.run(["callgrind_control", *args, str(self.pid)], check=True, capture_output=True)

    def count(self, during: Callable[[], None]) -> tuple[int, float]:
        """Instructions executed while `during()` ran, and the seconds it took."""
        before = set(self.dump.parent.glob(self.dump.name + ".*"))
        self._ctl("--zero")
        self._ctl("--instr=on")
        started = time.monotonic()
        during()
        took = time.monotonic() - started
        self._ctl("--dump")
        self._ctl("--instr=off")
        new = sorted(set(self.dump.parent.glob(self.dump.name + ".*")) - before)
        if not new:
            raise RuntimeError("callgrind wrote no dump")
        total = _instructions(new[-1])
        for path in new:
            path.unlink()
        return total, took


def _instructions(dump: Path) -> int:
    for line in dump.read_text(errors="replace").splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {dump}")


@dataclass
class Gateway:
    name: str
    url: str
    up: Upstream
    counter: Counter
    idle_per_s: float = 0.0
    key: str = subjects.GATEWAY_KEY  # the floor relay passes the upstream's key through

    def run(self, s: Scenario, n: int) -> float:
        """Instructions per request over `n` requests one after another."""
        with httpx.Client(base_url=self.url, headers=subjects.bearer(self.key)) as c:
            send(c, self.up, s)  # the connection is open before counting starts

            def load() -> None:
                for _ in range(n):
                    send(c, self.up, s)

            total, _ = self.counter.count(load)
        return total / n

    def measure_idle(self, seconds: float) -> None:
        """What the gateway runs while no request comes (its slowed clock's ticks)."""
        total, took = self.counter.count(lambda: time.sleep(seconds))
        self.idle_per_s = total / took


def faketime() -> str:
    """libfaketime's library (Debian's `faketime` package)."""
    found = sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))
    if not found:
        raise RuntimeError("libfaketime is not installed (make cost-guard installs `faketime`)")
    return str(found[0])


def _callgrind(tmp: Path, name: str) -> tuple[Path, list[str], dict[str, str]]:
    dump = tmp / f"callgrind-{name}.out"
    vg = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={dump}"]
    return dump, vg, {"PYTHONHASHSEED": "0", "LD_PRELOAD": faketime(), "FAKETIME": CLOCK}


def start_gateway(
    group: Group, tmp: Path, name: str, redis_url: str | None, log_level: str = "warning"
) -> Gateway:
    up = start_upstream()
    dump, vg, extra = _callgrind(tmp, name)
    subject = subjects.tokengate(
        group,
        name,
        tmp / name,
        up.url,
        workers=1,
        redis_url=redis_url,
        extra_env=extra,
        wrap=vg,
        log_level=log_level,
    )
    assert subject.proc is not None
    return Gateway(name, subject.url, up, Counter(subject.proc.pid, dump))


# -- measuring ---------------------------------------------------------------------------


@dataclass
class Figure:
    rounds: list[float]  # in the order measured
    pair: tuple[float, float]  # the two that agree

    @property
    def value(self) -> float:
        return sum(self.pair) / 2

    @property
    def spread(self) -> float:
        return abs(self.pair[0] - self.pair[1]) / max(self.pair)


def agreeing(rounds: list[float]) -> tuple[float, float] | None:
    """The lowest two rounds if they agree within AGREE. A tick of the gateway's slowed
    clock only ever adds instructions to a round, so the lowest two are the clean ones."""
    a, b = sorted(rounds)[:2]
    return (a, b) if (b - a) / b <= AGREE else None


def until_agreed(measure: Callable[[], float], max_rounds: int) -> Figure:
    """Rounds of `measure()` until two agree within AGREE (at most `max_rounds`)."""
    rounds = [measure(), measure()]
    while agreeing(rounds) is None and len(rounds) < max_rounds:
        rounds.append(measure())
    low = sorted(rounds)[:2]
    return Figure(rounds, (low[0], low[1]))


def measure_default(
    gw: Gateway, n: int, warmup: int, max_rounds: int, skip: frozenset[str] = frozenset()
) -> dict[str, Figure]:
    short, long = scenarios(SHORT), scenarios(LONG)
    short = {name: s for name, s in short.items() if name not in skip}
    for s in (*short.values(), long["chat_stream"]):
        for _ in range(warmup):
            send_one(gw, s)
    gw.measure_idle(3.0)
    out = {
        name: until_agreed(lambda s=s: gw.run(s, n), max_rounds)  # type: ignore[misc]
        for name, s in short.items()
    }
    few = LONG // SHORT  # the long stream costs ~ as much as this many short ones
    longer = until_agreed(lambda: gw.run(long["chat_stream"], max(2, n // few)), max_rounds)
    # What one more event costs: both streams' agreeing figures, the same requests' rest.
    extra = [
        (b - a) / (LONG - SHORT) for a, b in zip(out["chat_stream"].pair, longer.pair, strict=True)
    ]
    out["chat_stream_event"] = Figure(extra, (extra[0], extra[1]))
    return out


def measure_json(gw: Gateway, name: str, n: int, warmup: int, max_rounds: int) -> dict[str, Figure]:
    """`chat_json` on a gateway of its own (through Redis, or logging at `info`)."""
    s = scenarios(SHORT)["chat_json"]
    for _ in range(warmup):
        send_one(gw, s)
    gw.measure_idle(3.0)
    return {name: until_agreed(lambda: gw.run(s, n), max_rounds)}


def send_one(gw: Gateway, s: Scenario) -> None:
    with httpx.Client(base_url=gw.url, headers=subjects.bearer(gw.key)) as c:
        send(c, gw.up, s)


def start_floor(group: Group, tmp: Path) -> Gateway:
    """The floor relay (`floor_app:relay`: uvicorn + aiohttp, nothing of tokengate) under
    the same callgrind, clock and upstream as the gateway."""
    up = start_upstream()
    dump, vg, extra = _callgrind(tmp, "floor")
    subject = subjects.floor(
        group, "floor", "relay", up.url, stream=False, cpus=None, wrap=vg, extra_env=extra
    )
    assert subject.proc is not None
    return Gateway(
        "floor", subject.url, up, Counter(subject.proc.pid, dump), key=subjects.UPSTREAM_KEY
    )


def measure_floor(n: int, warmup: int, max_rounds: int) -> dict[str, Figure]:
    """The floor relay's figures for the chat scenarios (not budgeted: a yardstick)."""
    with scratch("tokengate-guard-floor-") as tmp, Group(tmp) as group:
        gw = start_floor(group, tmp)
        figures = measure_default(gw, n, warmup, max_rounds, frozenset({"responses_stream"}))
        print(f"floor: {gw.idle_per_s:,.0f} instructions a second idle")
        return figures


def measure_all(
    n: int, warmup: int, max_rounds: int, skip: frozenset[str] = frozenset()
) -> dict[str, Figure]:
    """Every scenario's figure: the default gateway's, then the Redis one's, then the
    one logging at `info`."""
    keep = bool(os.environ.get("GUARD_KEEP"))
    with scratch("tokengate-guard-", keep) as tmp, Group(tmp) as group:
        redis_url = subjects.redis_server(group)
        if redis_url is None:
            raise RuntimeError("redis-server is not installed (make system-deps)")
        gws = {"guard": start_gateway(group, tmp, "guard", None)}
        figures = measure_default(gws["guard"], n, warmup, max_rounds, skip)
        if "chat_json_redis" not in skip:
            gws["guard-redis"] = start_gateway(group, tmp, "guard-redis", redis_url)
            figures |= measure_json(gws["guard-redis"], "chat_json_redis", n, warmup, max_rounds)
        if "chat_json_info" not in skip:
            gws["guard-info"] = start_gateway(group, tmp, "guard-info", None, log_level="info")
            figures |= measure_json(gws["guard-info"], "chat_json_info", n, warmup, max_rounds)
        stalls = sum(g.up.stalls for g in gws.values())
        if stalls:
            raise RuntimeError(f"{stalls} lockstep waits timed out: the counts are not exact")
        for g in gws.values():
            print(f"{g.name}: {g.idle_per_s:,.0f} instructions a second idle")
        return figures


# -- budgets -----------------------------------------------------------------------------

_ROW = re.compile(r"^(?P<name>[a-z_]+)\s*=\s*(?P<value>[0-9_]+)\s*$", re.M)


def load_budgets(text: str) -> dict[str, int]:
    return {k: int(v) for k, v in tomllib.loads(text)["budgets"].items()}


def verdicts(budgets: dict[str, int], measured: dict[str, float]) -> list[tuple[str, str]]:
    """(scenario, verdict) per scenario: `ok`, `over` (fails CI), `under` (lower the
    budget), `new` (no budget yet) or `missing` (a budget nobody measured)."""
    out: list[tuple[str, str]] = []
    for name in sorted(set(budgets) | set(measured)):
        if name not in measured:
            out.append((name, "missing"))
        elif name not in budgets:
            out.append((name, "new"))
        elif measured[name] > budgets[name] * (1 + TOLERANCE):
            out.append((name, "over"))
        elif measured[name] < budgets[name] * (1 - TOLERANCE):
            out.append((name, "under"))
        else:
            out.append((name, "ok"))
    return out


def updated(text: str, measured: dict[str, float], why: str, today: str) -> str:
    """`text` (budgets.toml) with each scenario's budget set to what was measured and a
    history line saying what changed it. Raising a budget needs `why`."""
    old = load_budgets(text)
    rising = [n for n, v in measured.items() if n in old and round(v) > old[n]]
    if rising and not why.strip():
        raise ValueError(f"raising {', '.join(rising)} needs --why: what bought the extra cost")
    changes = ", ".join(
        f"{n} {old[n]:,} -> {round(v):,}" if n in old else f"{n} {round(v):,}"
        for n, v in sorted(measured.items())
        if old.get(n) != round(v)
    )
    if not changes:
        return text
    seen: set[str] = set()

    def row(m: re.Match[str]) -> str:
        name = m["name"]
        if name not in measured:
            return m.group(0)
        seen.add(name)
        return f"{name} = {round(measured[name])}"

    head, sep, table = text.partition("[budgets]")
    table = _ROW.sub(row, table)
    table = table.rstrip("\n") + "\n"
    for name in sorted(set(measured) - seen):
        table += f"{name} = {round(measured[name])}\n"
    line = f"# {today}: {why.strip() or 'lowered to what was measured'} ({changes})\n"
    marker = "# -- history"
    if marker in head:
        before, _, after = head.partition(marker)
        nl = after.index("\n") + 1
        rest = after[nl:].rstrip("\n")
        head = before + marker + after[:nl] + (rest + "\n" if rest else "") + line + "\n"
    else:
        head += line
    return head + sep + table


def report(budgets: dict[str, int], figures: dict[str, Figure]) -> str:
    measured = {n: f.value for n, f in figures.items()}
    rows = ["| scenario | rounds (instructions/request) | spread | budget | vs budget | verdict |"]
    rows.append("|---|---|---|---|---|---|")
    for name, verdict in verdicts(budgets, measured):
        f = figures.get(name)
        rounds = " · ".join(f"{r:,.0f}" for r in f.rounds) if f else "-"
        spread = f"{f.spread:.2%}" if f else "-"
        budget = f"{budgets[name]:,}" if name in budgets else "-"
        ratio = f"{measured[name] / budgets[name]:.3f}" if f and name in budgets else "-"
        rows.append(f"| {name} | {rounds} | {spread} | {budget} | {ratio} | {verdict} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.bench.guard", description=__doc__)
    p.add_argument(
        "-n", type=int, default=40, help="requests a round (chat_stream_event: n/2 each)"
    )
    p.add_argument("--warmup", type=int, default=30, help="requests of each scenario first")
    p.add_argument("--rounds", type=int, default=4, help="most rounds a scenario gets")
    p.add_argument("--update", action="store_true", help="write the measured values as budgets")
    p.add_argument("--why", default="", help="with --update: what bought the change")
    p.add_argument("--budgets", type=Path, default=BUDGETS)
    p.add_argument(
        "--skip",
        nargs="*",
        default=[],
        choices=("responses_stream", "chat_json_redis", "chat_json_info"),
        help="leave scenarios out (an older tree without them)",
    )
    p.add_argument(
        "--floor",
        action="store_true",
        help="also count the floor relay (uvicorn + aiohttp alone) and print tokengate / floor",
    )
    p.add_argument(
        "--build",
        default="",
        help="count the build installed in this directory (make compiled: build/compiled) "
        "instead of the repo's source; the budgets are the source's",
    )
    args = p.parse_args(argv)
    subjects.use_build(args.build)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind is not installed: `make cost-guard` installs it", file=sys.stderr)
        return 2
    sigterm_as_interrupt()
    started = time.monotonic()
    figures = measure_all(args.n, args.warmup, args.rounds, frozenset(args.skip))
    text = args.budgets.read_text()
    budgets = load_budgets(text)
    print(report(budgets, figures))
    if args.floor:
        floor = measure_floor(args.n, args.warmup, args.rounds)
        print("\n| scenario | floor relay | tokengate | floor / tokengate |\n|---|---|---|---|")
        for name, f in floor.items():
            ours = figures[name].value
            print(f"| {name} | {f.value:,.0f} | {ours:,.0f} | {f.value / ours:.3f} |")
    print(f"\n({time.monotonic() - started:.0f} s; fails above budget x {1 + TOLERANCE:g})")
    unsettled = [n for n, f in figures.items() if f.spread > AGREE]
    if unsettled:
        print(f"rounds did not agree within {AGREE:.0%}: {', '.join(unsettled)}")
    if args.update:
        today = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
        measured = {n: f.value for n, f in figures.items()}
        args.budgets.write_text(updated(text, measured, args.why, today))
        print(f"budgets written to {args.budgets}")
        return 0
    over = [
        n for n, v in verdicts(budgets, {n: f.value for n, f in figures.items()}) if v == "over"
    ]
    if over:
        print(f"FAIL: over budget by more than {TOLERANCE:.0%}: {', '.join(over)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
