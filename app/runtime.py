"""Settings -> a frozen Runtime: the compiled view the gateway runs on.

Pure: reads the environment only through the mapping it is given. This is where the
seed's overlapping fields get their one rule (docs/configuration.md):

- upstream base URL of a domain: its own `api_base`, else settings.json
  `api_endpoint`, else `token_scheduler.api_base` (settings.json beats config.toml);
- upstream key of a domain: the variable named by its own `api_key_env`, else
  settings.json `api_key` (normally `${TAOTOKEN_API_KEY}`), else the variable named by
  `token_scheduler.api_key_env`;
- attempts per model: `retry_policy.max_attempts`, else `token_scheduler.max_retries + 1`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from pydantic import SecretStr

from app.billing.budget_rules import Budget
from app.billing.prices import to_nanos
from app.config.cluster import HeaderPolicyConfig
from app.config.problems import ConfigError, Problem
from app.config.schema import BudgetConfig, KeyConfig, ScaleUpConfig, Settings
from app.kinds import ApiStyle, BudgetMetric, BudgetScope, Priority, ServiceTier


@dataclass(frozen=True)
class DomainSpec:
    name: str
    api_base: str
    api_key: SecretStr = field(repr=False)
    api_key_env: str
    models: frozenset[str] | None
    max_inflight: int
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    quota_window_sec: float = 1.0
    weight: float = 1.0
    api_style: ApiStyle = ApiStyle.OPENAI
    # serves the Responses API (if api_style speaks OpenAI's); "chat": translated onto chat
    responses: bool | Literal["chat"] = True
    responses_websocket: bool = False  # ... and its WebSocket mode
    # Per comma-list header (`anthropic-beta`...): what of the client's values goes upstream.
    headers: Mapping[str, HeaderPolicyConfig] = field(default_factory=dict, hash=False)
    service_tiers: frozenset[ServiceTier] = frozenset()  # tiers the upstream serves itself


@dataclass(frozen=True)
class KeySpec:
    alias: str
    digests: tuple[str, ...]
    tokens_per_minute: int
    requests_per_minute: int
    priority: Priority = Priority.NORMAL
    models: frozenset[str] | None = None
    domain: str | None = None
    expires_at: datetime | None = None
    reserve_output: str | None = None  # None: rate_limit.reserve_output
    max_concurrent: int | None = None  # None: no cap
    team: str | None = None
    max_websockets: int | None = None  # None: server.max_websockets_per_key
    budgets: tuple[Budget, ...] = ()
    session_budgets: tuple[Budget, ...] = ()  # per agent session of this key
    service_tiers: frozenset[ServiceTier] | None = None  # allowed; None: all
    service_tier: ServiceTier | None = None  # forced on every request
    defer_window: str | None = None  # its batches wait for this window ("none": idle)
    defer_requests: str = "none"  # none | background | all (keys[].defer_requests)


@dataclass(frozen=True)
class TeamSpec:
    name: str
    budgets: tuple[Budget, ...] = ()


@dataclass(frozen=True)
class Runtime:
    settings: Settings
    domains: tuple[DomainSpec, ...]
    keys: tuple[KeySpec, ...]
    auth_enabled: bool
    attempts: int
    workers: int = 1
    source: str = ""
    files: tuple[str, str] | None = None  # (config.toml, settings.json) for reloads
    teams: tuple[TeamSpec, ...] = ()
    alerts_secret: SecretStr | None = field(default=None, repr=False)  # alerts.secret_env

    @property
    def default_model(self) -> str | None:
        return self.settings.model_route.default

    @property
    def fallbacks(self) -> tuple[str, ...]:
        return self.settings.model_route.fallbacks()


def compile_runtime(
    settings: Settings,
    environ: Mapping[str, str],
    *,
    no_auth: bool = False,
    workers: int = 1,
    source: str = "settings",
    files: tuple[str, str] | None = None,
) -> Runtime:
    problems: list[Problem] = []
    domains = _domains(settings, environ, problems, source)
    teams = _teams(settings, problems, source)
    keys = _keys(settings, {d.name for d in domains}, {t.name for t in teams}, problems, source)
    if not keys and not no_auth:
        problems.append(
            Problem(
                source,
                "keys",
                "no gateway keys are configured, so every client would be refused",
                "run `tokengate keys new --alias NAME` and add the printed line to `keys`, "
                "or start with --no-auth for a trusted network only",
            )
        )
    secret = _alerts_secret(settings, environ, problems, source)
    _defer_windows(settings, problems, source)
    if problems:
        raise ConfigError(problems)
    policy = settings.retry_policy
    attempts = (
        policy.max_attempts
        if policy.max_attempts is not None
        else settings.token_scheduler.max_retries + 1
    )
    if policy.client_retries == "client":
        attempts = 1
    return Runtime(
        settings=settings,
        domains=tuple(domains),
        keys=tuple(keys),
        auth_enabled=not no_auth,
        attempts=attempts,
        workers=workers,
        source=source,
        files=files,
        teams=tuple(teams),
        alerts_secret=secret,
    )


def _defer_windows(settings: Settings, problems: list[Problem], source: str) -> None:
    """`batch.defer_window` and keys' `defer_window` name windows of `billing.windows`."""
    windows = settings.billing.windows
    named = [("batch.defer_window", settings.batch.defer_window)]
    named += [(f"keys[{i}].defer_window", k.defer_window) for i, k in enumerate(settings.keys)]
    raw = settings.scale_up
    domains = [] if raw is None else raw if isinstance(raw, list) else [raw]
    named += [(f"scale_up[{i}].defer_window", d.defer_window) for i, d in enumerate(domains)]
    for where, name in named:
        if name not in (None, "none", "auto") and name not in windows:
            known = ", ".join(windows) or "none defined"
            problems.append(
                Problem(source, where, f"no billing window {name!r}", f"one of: {known}")
            )


def _alerts_secret(
    settings: Settings, environ: Mapping[str, str], problems: list[Problem], source: str
) -> SecretStr | None:
    """The webhooks' signing key: required (non-empty) once a webhook is configured."""
    alerts = settings.alerts
    if not alerts.webhooks:
        return None
    value = environ.get(alerts.secret_env, "").strip()
    if not value:
        problems.append(
            Problem(
                source,
                "alerts.secret_env",
                f"alert webhooks are configured but ${alerts.secret_env} is empty or unset, "
                "so their bodies could not be signed",
                f"export {alerts.secret_env}=<a long random string> (receivers verify "
                "x-tokengate-signature with it)",
            )
        )
        return None
    return SecretStr(value)


def _entries(settings: Settings) -> list[ScaleUpConfig]:
    raw = settings.scale_up
    if raw is None:
        return [ScaleUpConfig(domain=settings.cluster.scale_up_domain)]
    if isinstance(raw, ScaleUpConfig):
        return [raw.model_copy(update={"domain": raw.domain or settings.cluster.scale_up_domain})]
    return list(raw)


def _domains(
    settings: Settings, environ: Mapping[str, str], problems: list[Problem], source: str
) -> list[DomainSpec]:
    sched = settings.token_scheduler
    out: list[DomainSpec] = []
    seen: set[str] = set()
    for i, entry in enumerate(_entries(settings)):
        where = f"scale_up[{i}]"
        if entry.domain is None:
            problems.append(Problem(source, f"{where}.domain", "missing", "name every domain"))
            continue
        if entry.domain in seen:
            problems.append(
                Problem(source, f"{where}.domain", f"duplicate domain {entry.domain!r}", "rename")
            )
            continue
        seen.add(entry.domain)
        key = _upstream_key(settings, entry, environ)
        if key is None:
            var = entry.api_key_env or sched.api_key_env
            problems.append(
                Problem(
                    f"environment variable {var}",
                    f"{where}.api_key_env",
                    f"domain {entry.domain!r} has no upstream key: {var} is not set or is empty",
                    f"export {var}=... (containers must pass it explicitly)",
                )
            )
            continue
        out.append(
            DomainSpec(
                name=entry.domain,
                api_base=_base_url(entry.api_base or settings.api_endpoint or sched.api_base),
                api_key=key,
                api_key_env=entry.api_key_env or sched.api_key_env,
                models=frozenset(entry.models) if entry.models is not None else None,
                max_inflight=entry.max_inflight or sched.max_inflight,
                requests_per_minute=entry.requests_per_minute,
                tokens_per_minute=entry.tokens_per_minute,
                quota_window_sec=entry.quota_window_sec,
                weight=entry.weight,
                api_style=entry.api_style,
                responses=entry.responses,
                responses_websocket=entry.responses_websocket,
                headers={str(name): policy for name, policy in entry.headers.items()},
                service_tiers=frozenset(entry.service_tiers),
            )
        )
    return out


def _upstream_key(
    settings: Settings, entry: ScaleUpConfig, environ: Mapping[str, str]
) -> SecretStr | None:
    # Blank counts as unset: a variable holding only whitespace is an operator's slip.
    if entry.api_key_env:
        value = environ.get(entry.api_key_env, "")
        return SecretStr(value) if value.strip() else None
    if settings.api_key is not None and settings.api_key.get_secret_value().strip():
        return settings.api_key
    value = environ.get(settings.token_scheduler.api_key_env, "")
    return SecretStr(value) if value.strip() else None


def _base_url(url: str) -> str:
    # Clients habitually paste an OpenAI base URL ending in /v1; our paths carry /v1 already.
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _keys(
    settings: Settings, domains: set[str], teams: set[str], problems: list[Problem], source: str
) -> list[KeySpec]:
    limits = settings.rate_limit
    out: list[KeySpec] = []
    aliases: set[str] = set()
    digests: set[str] = set()
    for i, key in enumerate(settings.keys):
        where = f"keys[{i}]"
        if key.alias in aliases:
            problems.append(Problem(source, f"{where}.alias", "duplicate alias", "rename it"))
        if key.domain is not None and key.domain not in domains:
            problems.append(
                Problem(
                    source,
                    f"{where}.domain",
                    f"unknown domain {key.domain!r}",
                    f"use one of: {', '.join(sorted(domains))}",
                )
            )
        if key.team is not None and key.team not in teams:
            problems.append(
                Problem(
                    source,
                    f"{where}.team",
                    f"unknown team {key.team!r}",
                    'add it to `teams` ({"name": ..., "budgets": [...]})'
                    + (f", or use one of: {', '.join(sorted(teams))}" if teams else ""),
                )
            )
        for digest in key.digests():
            if digest in digests:
                problems.append(
                    Problem(source, f"{where}.key_sha256", "hash used by two keys", "new key")
                )
            digests.add(digest)
        aliases.add(key.alias)
        spec = _key_spec(
            key, limits.tokens_per_minute, limits.requests_per_minute, limits.max_concurrent
        )
        budgets = _budgets(
            BudgetScope.KEY, key.alias, key.budgets, f"{where}.budgets", problems, source
        )
        per_session = _budgets(
            BudgetScope.KEY,
            key.alias,
            [key.session_budget] if key.session_budget else [],
            f"{where}.session_budget",
            problems,
            source,
        )
        out.append(
            dataclasses.replace(spec, team=key.team, budgets=budgets, session_budgets=per_session)
        )
    return out


def _teams(settings: Settings, problems: list[Problem], source: str) -> list[TeamSpec]:
    out: list[TeamSpec] = []
    for i, team in enumerate(settings.teams):
        where = f"teams[{i}]"
        if any(t.name == team.name for t in out):
            problems.append(Problem(source, f"{where}.name", "duplicate team name", "rename it"))
            continue
        budgets = _budgets(
            BudgetScope.TEAM, team.name, team.budgets, f"{where}.budgets", problems, source
        )
        out.append(TeamSpec(team.name, budgets))
    return out


def _budgets(
    scope: BudgetScope,
    owner: str,
    found: list[BudgetConfig],
    where: str,
    problems: list[Problem],
    source: str,
) -> tuple[Budget, ...]:
    """One `Budget` per limit: a `max_cost` and a `max_tokens` of one period are two."""
    out: list[Budget] = []
    for i, cfg in enumerate(found):
        limits = (
            (BudgetMetric.COST, cfg.max_cost and to_nanos(cfg.max_cost)),
            (BudgetMetric.TOKENS, cfg.max_tokens),
        )
        for metric, limit in limits:
            if not limit:
                continue
            budget = Budget(scope, owner, cfg.period, metric, limit, cfg.on_short)
            if any(b.name == budget.name for b in out):
                problems.append(
                    Problem(
                        source,
                        f"{where}[{i}]",
                        f"a second {cfg.period} {metric} budget for {scope} {owner!r}",
                        "keep one budget per period and metric",
                    )
                )
                continue
            out.append(budget)
    return tuple(out)


def _key_spec(key: KeyConfig, tpm: int, rpm: int, concurrent: int | None = None) -> KeySpec:
    expires = key.expires_at
    if expires is not None and expires.tzinfo is None:
        expires = expires.replace(tzinfo=UTC)
    return KeySpec(
        alias=key.alias,
        digests=key.digests(),
        tokens_per_minute=key.tokens_per_minute or tpm,
        requests_per_minute=key.requests_per_minute or rpm,
        priority=key.priority,
        models=frozenset(key.models) if key.models is not None else None,
        domain=key.domain,
        expires_at=expires,
        reserve_output=key.reserve_output,
        max_concurrent=key.max_concurrent or concurrent,
        max_websockets=key.max_websockets,
        service_tiers=None if key.service_tiers is None else frozenset(key.service_tiers),
        service_tier=key.service_tier
        or (ServiceTier.FLEX if key.defer_requests == "all" else None),  # deferral.md
        defer_window=key.defer_window,
        defer_requests=key.defer_requests,
    )
