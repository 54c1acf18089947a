"""The start-up banner: what this gateway is, in a dozen lines on the terminal.

Printed to stderr by `serve` once its address is bound (once per start: with
`--workers N` by the supervisor, not by each worker), whatever `logging.output` says,
since with a log file nothing else reaches the terminal. It answers what an operator
asks first: where it listens, which domains serve which models through which upstream
route (direct or which proxy; never a credential), how many keys, where the state and
the logs are. Pure: built from the runtime, the address and the environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import UTC, datetime
from urllib.parse import urlsplit

from app import build
from app.kinds import ApiStyle
from app.log import redacted_url
from app.runtime import DomainSpec, Runtime
from app.upstream.proxyenv import Proxies

_INDENT = "            "
_DIALECTS = {
    ApiStyle.OPENAI: "OpenAI API",
    ApiStyle.ANTHROPIC: "Anthropic Messages API",
    ApiStyle.BOTH: "OpenAI and Anthropic APIs",
}


def render(
    runtime: Runtime,
    url: str,
    *,
    workers: int = 1,
    environ: Mapping[str, str] | None = None,
    now: datetime | None = None,
) -> str:
    env = os.environ if environ is None else environ
    plural = "s" if workers > 1 else ""
    lines = [f"tokengate {build.installed_version()} listening on {url} ({workers} worker{plural})"]
    proxies = Proxies(dict(env))
    for spec in runtime.domains:
        lines += _domain(spec, proxies)
    lines.append(f"  routes    {_routes(runtime)}")
    lines.append(f"  keys      {_keys(runtime, now or datetime.now(UTC))}")
    lines.append(f"  state     {'; '.join(_state(runtime))}")
    lines.append(f"  logs      {_logs(runtime)}")
    lines.append(f"  build     {_build()}")
    lines.append(f"  try       curl {url}/health/ready   (metrics: {url}/metrics)")
    return "\n".join(lines)


def _build() -> str:
    compiled, listed = build.compiled_modules()
    name = build.build_name()
    if name == "interpreted":
        return "interpreted (pure Python; the image is compiled: README, Operations)"
    return f"{name} with mypyc ({compiled} of {listed} modules of the request's path)"


def _domain(spec: DomainSpec, proxies: Proxies) -> list[str]:
    models = (
        ", ".join(sorted(spec.models))
        if spec.models is not None
        else "discovered from the upstream's /v1/models"
    )
    quota = [f"max_inflight {spec.max_inflight}"]
    if spec.requests_per_minute:
        quota.append(f"{spec.requests_per_minute} requests/min")
    if spec.tokens_per_minute:
        quota.append(f"{spec.tokens_per_minute} tokens/min")
    return [
        f"  domain    {spec.name}: models {models}",
        f"{_INDENT}upstream {redacted_url(spec.api_base)} {_route(spec.api_base, proxies)}; "
        f"key from ${spec.api_key_env}; {_DIALECTS[spec.api_style]}; {', '.join(quota)}",
    ]


def _route(base: str, proxies: Proxies) -> str:
    """How the upstream is reached, as the transport will reach it (`app.upstream`)."""
    parts = urlsplit(base)
    if not parts.hostname:
        return "(not an http(s) URL)"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        route = proxies.route(parts.scheme, parts.hostname, port)
    except ValueError as exc:
        return f"(proxy setting unusable: {exc})"
    return "(direct)" if route is None else f"(via proxy {route.shown})"  # `shown`: no secret


def _routes(runtime: Runtime) -> str:
    s = runtime.settings
    parts = [f"default model {s.model_route.default or '(none: requests must name one)'}"]
    if runtime.fallbacks:
        parts.append(f"fallback {', '.join(runtime.fallbacks)}")
    if s.model_aliases:
        shown = ", ".join(f"{a} -> {t}" for a, t in sorted(s.model_aliases.items())[:4])
        more = f" (+{len(s.model_aliases) - 4} more)" if len(s.model_aliases) > 4 else ""
        parts.append(f"aliases {shown}{more}")
    return "; ".join(parts)


def _keys(runtime: Runtime, now: datetime) -> str:
    if not runtime.auth_enabled:
        return "AUTHENTICATION IS OFF (--no-auth): anyone who can reach the port is served"
    expired = [k.alias for k in runtime.keys if k.expires_at is not None and k.expires_at <= now]
    text = f"{len(runtime.keys)} gateway key{'s' if len(runtime.keys) != 1 else ''}"
    if expired:
        text += f" ({len(expired)} expired: {', '.join(expired)})"
    admin = "on" if runtime.settings.admin_key is not None else "off (TOKENGATE_ADMIN_KEY unset)"
    return f"{text}; admin API {admin}"


def _state(runtime: Runtime) -> list[str]:
    """Where shared and durable state lives: hot limits (in-process or Redis), and the
    database of the ledger, batches and live key limits (named without a password)."""
    from app.db.url import database_url  # SQLAlchemy: `serve` has loaded it already
    from app.db.url import where as db_where

    s = runtime.settings
    target = s.redis.target()
    if target is not None:
        where = target.where()  # shape and addresses, never a credential
        limits = f"limits and quotas shared through Redis {where} (fail {s.redis.fail_mode})"
    elif runtime.workers > 1:
        limits = f"limits and quotas in-process, split 1/{runtime.workers} per worker"
    else:
        limits = "limits and quotas in-process"
    durable = f"ledger, batches and live limits in {db_where(database_url(s.database))}"
    return [limits, durable]


def _logs(runtime: Runtime) -> str:
    cfg = runtime.settings.logging
    if cfg.output in ("stdout", "stderr"):
        return f"JSON lines to {cfg.output}, level {cfg.level}"
    return (
        f"JSON lines to {os.path.abspath(cfg.output)}, level {cfg.level} "
        "(nothing more is printed here)"
    )
