"""`tokengate check`: verify the chain from API entry to compute domain.

The steps of docs/design.md ("Verifying the chain"), in its diagnosis order (endpoint,
key, model route, scheduler parameters):

  1. configuration: both files and the environment load (else exit 2), and what
     `serve` needs is there: the log output, the listening address, the state stores
     (`app.commands.preflight`, the same code `serve` runs);
  2. `GET /v1/models` with the key: 200, and every routed/aliased model is listed;
  3. a minimal chat completion (`ping`, `max_tokens: 8`) returns `choices` and usage;
  4. 16 concurrent probes from 8 workers: `16/16 ok`, usage adding up, then whether
     `batch_size` and the rate limits fit that concurrency.

Against the upstream of every configured domain by default, or a running gateway
with `--target URL` (authenticated with `--key` / `TOKENGATE_API_KEY`). Each failure
prints a specific diagnosis; any failure exits 1. The probes show their progress as
they finish (a counter on a terminal, a dot each otherwise), and a timeout says how
long it waited.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx

from app.billing.prices import PriceList
from app.billing.timetable import Timetable
from app.commands.preflight import findings
from app.config.problems import ConfigError
from app.config.schema import Settings
from app.config.sources import PLACEHOLDER, ConfigFiles, load_settings, secret_environ
from app.config.variables import warnings
from app.log import Redactor, redacted_url
from app.runtime import Runtime, compile_runtime
from app.upstream import cause

PROBES, WORKERS = 16, 8


@dataclass
class Target:
    name: str
    base: str  # without /v1
    key: str
    key_source: str
    model: str | None
    routed: list[str] = field(default_factory=list)
    wait_sec: float = 30.0  # the timeout of each call, said when one runs out

    @property
    def shown(self) -> str:
        return redacted_url(self.base)


class StepFailed(Exception):
    pass


def _say(text: str) -> None:
    print(text, flush=True)


def diagnose(exc: BaseException, target: Target) -> str:
    """One line an operator can act on, for each failure class of docs/design.md (the
    classification `app.upstream.cause` makes for the gateway too)."""
    if isinstance(exc, httpx.ConnectError):
        found = cause.of_exception(exc)
        return f"{cause.summary(found, cause.address(target.base))}. {cause.advice(found)}"
    if isinstance(exc, httpx.TimeoutException):
        shown = redacted_url(target.base)
        return (
            f"{cause.summary(cause.Cause.TIMEOUT, shown)} within {target.wait_sec:g} s "
            f"(token_scheduler.timeout_ms): {_lower(cause.advice(cause.Cause.TIMEOUT))}"
        )
    if isinstance(exc, httpx.HTTPStatusError):
        return _diagnose_status(exc.response, target)
    return Redactor().scrub(f"{type(exc).__name__}: {exc}")  # a URL's userinfo included


def _lower(text: str) -> str:
    return text[:1].lower() + text[1:]


def _diagnose_status(resp: httpx.Response, target: Target) -> str:
    code = resp.status_code
    found = cause.of_status(code)
    if found is cause.Cause.STATUS:
        return f"HTTP {code}: {resp.text[:200]}"
    advice = cause.advice(found, key_source=target.key_source, model=target.model or "")
    return f"{code}: {_lower(advice)}"


async def _models(client: httpx.AsyncClient, t: Target) -> list[str]:
    resp = await client.get(f"{t.base}/v1/models")
    resp.raise_for_status()
    ids = [m["id"] for m in resp.json().get("data", []) if isinstance(m, dict) and "id" in m]
    _say(f"      200, {len(ids)} model(s): {', '.join(ids[:8])}{' ...' if len(ids) > 8 else ''}")
    missing = [m for m in t.routed if m not in ids]
    if missing:
        raise StepFailed(
            f"model route names model(s) the upstream does not list: {', '.join(missing)}. Fix: "
            "point model_route / model_aliases in settings.json at listed ids (e.g. an alias "
            f'"{missing[0]}": "<listed id>"), or add the model to that domain.'
        )
    if t.model is None and ids:
        t.model = ids[0]
    return ids


async def _ping(client: httpx.AsyncClient, t: Target) -> tuple[int, int]:
    body = {"model": t.model, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 8}
    resp = await client.post(f"{t.base}/v1/chat/completions", json=body)
    resp.raise_for_status()
    data = resp.json()
    usage = data.get("usage") or {}
    if not data.get("choices") or "prompt_tokens" not in usage or "completion_tokens" not in usage:
        raise StepFailed(f"answer lacks choices or usage: {str(data)[:200]}")
    return int(usage["prompt_tokens"]), int(usage["completion_tokens"])


async def _probes(client: httpx.AsyncClient, t: Target) -> tuple[int, int, int, list[str]]:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(PROBES):
        queue.put_nowait(i)
    ok, prompt, completion, errors = 0, 0, 0, []
    progress = Progress(sys.stdout.isatty())

    async def worker() -> None:
        nonlocal ok, prompt, completion
        while not queue.empty():
            queue.get_nowait()
            try:
                p, c = await _ping(client, t)
            except Exception as exc:
                errors.append(diagnose(exc, t) if not isinstance(exc, StepFailed) else str(exc))
                progress.finished(ok, len(errors), passed=False)
            else:
                ok, prompt, completion = ok + 1, prompt + p, completion + c
                progress.finished(ok, len(errors), passed=True)

    await asyncio.gather(*(worker() for _ in range(WORKERS)))
    progress.end()
    return ok, prompt, completion, errors


class Progress:
    """One mark per finished probe, as it finishes: a counter rewritten in place on a
    terminal, a dot (`.` ok, `x` failed) on a line otherwise (logs, CI, pipes)."""

    def __init__(self, tty: bool) -> None:
        self.tty = tty
        self.started = time.monotonic()
        print("      probes: ", end="", flush=True)

    def finished(self, ok: int, failed: int, *, passed: bool) -> None:
        done = ok + failed
        if self.tty:
            elapsed = time.monotonic() - self.started
            print(
                f"\r      probes: {done}/{PROBES} done, {ok} ok ({elapsed:.1f}s)",
                end="",
                flush=True,
            )
        else:
            print("." if passed else "x", end="", flush=True)

    def end(self) -> None:
        print(flush=True)


async def _verify(t: Target, wait_sec: float, runtime: Runtime | None) -> bool:
    _say(f"== {t.name}: {t.shown}")
    headers = {"authorization": f"Bearer {t.key}"}
    steps = 0
    async with httpx.AsyncClient(headers=headers, timeout=wait_sec) as client:
        try:
            steps += 1
            _say("  [2] GET /v1/models with the key")
            _unpriced(runtime, await _models(client, t))
            steps += 1
            _say(f"  [3] chat completion 'ping' (max_tokens 8) on model '{t.model}'")
            p, c = await _ping(client, t)
            _say(f"      ok: choices present, usage prompt_tokens={p} completion_tokens={c}")
            steps += 1
            _say(f"  [4] {PROBES} concurrent probes from {WORKERS} workers")
            ok, sp, sc, errors = await _probes(client, t)
            _say(f"      {ok}/{PROBES} ok, usage prompt_tokens={sp} completion_tokens={sc}")
            if errors:
                raise StepFailed(f"{len(errors)} probe(s) failed; first: {errors[0]}")
            if sp != p * PROBES:
                raise StepFailed(
                    f"usage does not add up: {sp} prompt tokens, expected {p * PROBES}"
                )
            _advice(runtime)
        except StepFailed as exc:
            _say(f"      FAILED: {exc}")
            return False
        except Exception as exc:
            _say(f"      FAILED: {diagnose(exc, t)}")
            return False
    return True


def _unpriced(runtime: Runtime | None, models: list[str]) -> None:
    """Warn about models without a price: their cost would be recorded as unknown."""
    if runtime is None:
        return
    billing = runtime.settings.billing
    missing = PriceList(billing.prices, billing.currency).unpriced(models)
    if missing:
        _say(
            f"      warning: no price in billing.prices for {len(missing)} model(s): "
            f"{', '.join(missing)} (their cost is recorded as unknown)"
        )


def window_lines(runtime: Runtime, now: float) -> list[str]:
    """The billing window in force at `now` and the next change (none: no lines)."""
    billing = runtime.settings.billing
    timetable = Timetable(billing.windows, billing.timezone)
    if not timetable:
        return []
    current = timetable.at(now) or "none (base prices)"
    lines = [f"billing window now: {current} ({billing.timezone})"]
    change = timetable.next_change(now)
    if change is None:
        lines.append("next window change: never")
    else:
        after = change.window or "none (base prices)"
        lines.append(f"next window change: {timetable.describe(change.at)} -> {after}")
    return lines


def _windows(runtime: Runtime, now: float) -> None:
    for line in window_lines(runtime, now):
        _say(f"      {line}")


def configured_models(runtime: Runtime) -> list[str]:
    """Models the configuration names: domains' lists, routes and alias targets."""
    s = runtime.settings
    named = {m for d in runtime.domains for m in (d.models or ())}
    named |= {s.model_aliases.get(m, m) for m in (s.model_route.default, *runtime.fallbacks) if m}
    named |= set(s.model_aliases.values())
    return sorted(named)


def _advice(runtime: Runtime | None) -> None:
    if runtime is None:
        return
    s = runtime.settings
    batch = s.token_scheduler.batch_size
    rpm = s.rate_limit.requests_per_minute
    notes = []
    if batch > 4 * WORKERS:
        notes.append(
            f"batch_size={batch} is large for {WORKERS} concurrent clients; 16-32 keeps "
            "dispatch latency low"
        )
    if rpm < PROBES * 4:
        notes.append(f"rate_limit.requests_per_minute={rpm} leaves little room for bursts")
    for note in notes or ["batch_size and rate limits fit this concurrency"]:
        _say(f"      note: {note}")


def _targets(runtime: Runtime) -> list[Target]:
    s = runtime.settings
    aliases = s.model_aliases
    routed = [m for m in [s.model_route.default, *runtime.fallbacks] if m]
    targets = []
    for d in runtime.domains:
        wanted = [aliases.get(m, m) for m in routed] + [t for t in aliases.values()]
        model = aliases.get(s.model_route.default or "", s.model_route.default)
        if d.models is not None:
            wanted = [m for m in wanted if m in d.models]
            model = model if model in d.models else next(iter(sorted(d.models)), None)
        targets.append(
            Target(
                d.name,
                d.api_base,
                d.api_key.get_secret_value(),
                d.api_key_env,
                model,
                sorted(set(wanted)),
            )
        )
    return targets


def run_check(
    files: ConfigFiles,
    *,
    target: str | None,
    key: str | None,
    host: str = "127.0.0.1",
    port: int = 8080,
    no_auth: bool = False,
) -> int:
    _say(f"  [1] configuration: {files.config} + {files.settings}")
    runtime: Runtime | None = None
    if target is None or (files.config.exists() and files.settings.exists()):
        try:
            environ = secret_environ()
            if target is not None:  # the gateway holds the upstream keys, not this shell
                environ = _without_upstream_keys(files, environ)
            settings = load_settings(files, environ)
            if target is not None:
                environ = _key_placeholders(environ, _key_variables(settings))
            # The chain to the upstream does not need gateway keys; `serve` does (below).
            runtime = compile_runtime(
                settings, environ, no_auth=True, source=f"{files.settings} / {files.config}"
            )
        except ConfigError as exc:
            _say(exc.render())
            if target is None:
                return 2
            _say(
                "      note: the local config does not validate here; checking the remote "
                "gateway only"
            )
        else:
            names = ", ".join(f"{d.name} -> {redacted_url(d.api_base)}" for d in runtime.domains)
            _say(f"      ok: {len(runtime.domains)} domain(s): {names}")
            _unpriced(runtime, configured_models(runtime))
            _windows(runtime, time.time())
    else:
        _say("      skipped: no local config files (checking a remote gateway)")
    for line in warnings(os.environ):
        _say(f"      warning: {line}")
    serveable = True
    if target is None:
        assert runtime is not None
        serveable = _serve_needs(runtime, host, port, no_auth=no_auth)
    timeout = (runtime.settings.token_scheduler.timeout_ms / 1000) if runtime else 30.0
    started = time.monotonic()
    if target is not None:
        gw_key = key or os.environ.get("TOKENGATE_API_KEY", "")
        if not gw_key:
            _say("      FAILED: no gateway key: pass --key or set TOKENGATE_API_KEY")
            return 1
        base = target.rstrip("/").removesuffix("/v1")
        default = runtime.settings.model_route.default if runtime else None
        targets = [Target("gateway", base, gw_key, "--key / TOKENGATE_API_KEY", default)]
    else:
        assert runtime is not None
        targets = _targets(runtime)
    for t in targets:
        t.wait_sec = timeout
    results = [asyncio.run(_verify(t, timeout, runtime)) for t in targets]
    ok = all(results) and serveable
    refusal = "" if serveable else "`tokengate serve` would not start (see [1]); "
    _say(
        f"{'OK' if ok else 'FAILED'}: {refusal}{sum(results)}/{len(results)} target(s) "
        f"verified in {time.monotonic() - started:.1f}s"
    )
    return 0 if ok else 1


_NOT_NEEDED = "not-needed-to-check-a-running-gateway"


def _key_placeholders(environ: dict[str, str], names: set[str]) -> dict[str, str]:
    """`environ` with a stand-in for each of `names` that is unset or empty."""
    return environ | {n: _NOT_NEEDED for n in names if not environ.get(n)}


def _without_upstream_keys(files: ConfigFiles, environ: dict[str, str]) -> dict[str, str]:
    """With `--target` the chain is checked through a running gateway, which holds the
    upstream keys: the `${VAR}`s of settings.json need not be set in this shell."""
    try:
        text = files.settings.read_text("utf-8")
    except OSError:
        return environ
    return _key_placeholders(environ, set(PLACEHOLDER.findall(text)))


def _key_variables(settings: Settings) -> set[str]:
    """The variables the domains' upstream keys are read from."""
    entries = settings.scale_up if isinstance(settings.scale_up, list) else [settings.scale_up]
    names = {e.api_key_env for e in entries if e is not None and e.api_key_env}
    return names | {settings.token_scheduler.api_key_env}


def _serve_needs(runtime: Runtime, host: str, port: int, *, no_auth: bool) -> bool:
    """What `serve` checks at start, checked now (`app.commands.preflight`); False if it would
    refuse to start."""
    _say(f"      what `tokengate serve --host {host} --port {port}` needs:")
    found = asyncio.run(findings(runtime, host, port))
    for f in found:
        if f.ok:
            _say(f"        ok: {f.what}")
        else:
            _say(f"        FAILED: {f.what}: {f.problem}" + (f". Fix: {f.fix}" if f.fix else ""))
    ok = all(f.ok for f in found)
    if not runtime.settings.keys and not no_auth:
        ok = False
        _say(
            "        FAILED: no gateway keys in `keys`: serve refuses to start without them. "
            "Fix: run `tokengate keys new --alias NAME` and add the printed line "
            "(or serve --no-auth on a trusted network only)"
        )
    now = datetime.now(UTC)
    for k in runtime.keys:
        if k.expires_at is not None and k.expires_at <= now:
            _say(f"        note: key {k.alias!r} expired at {k.expires_at.isoformat()} (401)")
    return ok
