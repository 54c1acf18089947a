"""Declared configuration: one typed model over both seed files.

`config.toml` (cluster side) and `settings.json` (access side) are two views of one
namespace: every section below may appear in either file, settings.json wins over
config.toml, and `TOKENGATE_<SECTION>__<FIELD>` environment variables win over both.
Every model forbids unknown keys so a typo is an error, not a silently ignored knob.
Each `Field(description=...)` is also the README's configuration reference
(`tokengate config-reference` renders it), so a description is written for operators.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Annotated, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.config.redis_target import RedisTarget, TargetError, parse_target
from app.kinds import ApiStyle, Priority

PositiveInt = Annotated[int, Field(gt=0)]
ReserveOutput = Literal["estimate", "max_tokens"]
DomainName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")]
TeamName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
# Money per million tokens or per period, in `billing.currency`: exact decimals, never floats.
Money = Annotated[Decimal, Field(ge=0, decimal_places=9, allow_inf_nan=False)]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ClusterConfig(Section):
    name: str = Field("tokengate", description="Cluster name, shown in `/admin/status`.")
    scale_up_domain: DomainName = Field(
        "default",
        description="Domain id used when `[scale_up]` is a single table (one domain).",
    )
    node_count: int = Field(1, ge=1, description="Management nodes (informational).")
    gpu_per_node: int = Field(8, ge=0, description="GPUs per node (informational).")
    total_gpus: int = Field(8, ge=0, description="GPUs in the supernode (informational).")


class TokenSchedulerConfig(Section):
    api_base: str = Field(
        "https://taotoken.net/api",
        description="Default upstream base URL (OpenAI-compatible, without `/v1`) for domains "
        "that set no `api_base`. `api_endpoint` in settings.json, when set, takes precedence.",
    )
    api_key_env: str = Field(
        "TAOTOKEN_API_KEY",
        description="Environment variable holding the default upstream key. "
        "Keys never live in files.",
    )
    timeout_ms: PositiveInt = Field(
        30000,
        description="Upstream read timeout per attempt (time between bytes) and total per attempt "
        "for non-streaming calls; exhaustion answers 504.",
    )
    connect_timeout_ms: PositiveInt = Field(
        5000, description="Upstream TCP/TLS connect timeout per attempt."
    )
    max_retries: int = Field(
        3,
        ge=0,
        le=10,
        description="Retries after the first attempt; used only when `retry_policy.max_attempts` "
        "is unset (attempts = max_retries + 1).",
    )
    batch_size: int = Field(
        16,
        ge=1,
        le=4096,
        description="Most queued requests a domain releases upstream in one dispatch group. "
        "Too large makes a group wait to fill: lower it (64 -> 16/32) when dispatch latency "
        "is high.",
    )
    batch_window_ms: float = Field(
        2.0,
        ge=0,
        le=1000,
        description="Longest a dispatch group of queued requests waits to fill; a request that "
        "finds a free slot and nobody queued goes at once.",
    )
    queue_capacity: int = Field(
        1024, ge=1, description="Queued requests per domain; past it new requests get 503."
    )
    max_queue_wait_ms: PositiveInt = Field(
        30000, description="A request queued longer than this gets 503 with Retry-After."
    )
    max_inflight: int = Field(
        64,
        gt=0,
        le=100_000,
        description="Default limit of concurrent upstream requests per domain (a stream holds "
        "its slot until it ends).",
    )


class ScaleUpConfig(Section):
    domain: DomainName | None = Field(
        None,
        description="Domain id. Required in the `[[scale_up]]` array form; the single-table "
        "form uses `cluster.scale_up_domain`.",
    )
    interconnect: str = Field("high-speed", description="Interconnect type (informational).")
    latency_target_us: float | None = Field(
        None, ge=0, description="Target GPU-to-GPU latency in microseconds (informational)."
    )
    memory_pool: str | None = Field(None, description="Memory pool kind (informational).")
    api_base: str | None = Field(
        None, description="This domain's upstream base URL; default `token_scheduler.api_base`."
    )
    api_key_env: str | None = Field(
        None,
        description="Environment variable with this domain's upstream key, so domains do not "
        "share one quota; default `token_scheduler.api_key_env`.",
    )
    models: list[str] | None = Field(
        None,
        description="Models this domain serves; unset means discovered from the upstream's "
        "`/v1/models` at start and on every health probe.",
    )
    max_inflight: PositiveInt | None = Field(
        None, description="Concurrent upstream requests; default `token_scheduler.max_inflight`."
    )
    requests_per_minute: PositiveInt | None = Field(
        None,
        description="This domain's upstream key quota in requests/min: the gateway paces to "
        "stay under it (queues, never rejects).",
    )
    tokens_per_minute: PositiveInt | None = Field(
        None, description="This domain's upstream key quota in tokens/min, paced like requests."
    )
    quota_window_sec: float = Field(
        1.0,
        gt=0,
        le=60,
        description="Shortest window the upstream may count its quota over: no interval this "
        "long gets more than its share of the quota (a burst of 5 % of it, the rest spaced). "
        "Providers quantize per-minute quotas to short windows, hence 1 s; longer allows "
        "bigger bursts, and is safe only if the upstream really counts that long.",
    )
    weight: float = Field(
        1.0, gt=0, description="Routing weight among domains serving the same model."
    )
    api_style: ApiStyle = Field(
        ApiStyle.OPENAI,
        description="Which API the upstream speaks: `openai` (chat/completions/embeddings), "
        "`anthropic` (`POST /v1/messages`, authenticated with `x-api-key`) or `both`.",
    )
    responses: bool = Field(
        True,
        description="The upstream (api_style `openai` or `both`) serves OpenAI's Responses API "
        "(`/v1/responses`); false keeps Responses traffic, and the WebSocket mode, off "
        "this domain.",
    )
    responses_websocket: bool = Field(
        False,
        description="The upstream also serves the Responses WebSocket mode (OpenAI does): "
        "requests that reach the gateway over its WebSocket mode go on over a WebSocket of "
        "their own, one per client connection, sending only the new items while the "
        "upstream holds the conversation. False: HTTP + SSE, the whole conversation each time.",
    )


class ScaleOutConfig(Section):
    enabled: bool = Field(False, description="Scale-out network in use (informational).")
    protocol: str = Field("rdma", description="Scale-out protocol (informational).")
    fallback: str = Field("tcp", description="Scale-out fallback protocol (informational).")


class LoggingConfig(Section):
    level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level.")
    output: str = Field(
        "stderr",
        description="`stdout`, `stderr` or a file path; the directory must exist and be writable.",
    )
    log_prompts: bool = Field(
        False,
        description="Debug only: include prompt text in request log lines. Off, prompts never "
        "reach the log.",
    )

    @field_validator("level", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value


class ModelRouteConfig(Section):
    default: str | None = Field(None, description="Model used when a request names none.")
    fallback: str | list[str] | None = Field(
        None,
        description="Model(s) tried, in order, when the requested model's attempts are "
        "exhausted or no healthy domain serves it.",
    )

    def fallbacks(self) -> tuple[str, ...]:
        if self.fallback is None:
            return ()
        return (self.fallback,) if isinstance(self.fallback, str) else tuple(self.fallback)


class RateLimitConfig(Section):
    tokens_per_minute: PositiveInt = Field(
        120000, description="Default per-key token allowance per minute (prompt + completion)."
    )
    requests_per_minute: PositiveInt = Field(
        600, description="Default per-key request allowance per minute."
    )
    default_max_tokens: PositiveInt = Field(
        1024,
        description="Completion tokens reserved at admission when a request sets no "
        "`max_tokens`; corrected to real usage when the answer ends.",
    )
    reserve_output: ReserveOutput = Field(
        "estimate",
        description="Output tokens a request reserves at admission: `estimate` (a high "
        "percentile, `output_percentile`, of the key's recent completions for that model, "
        "capped by `max_tokens`; `default_max_tokens` until 5 are known) or `max_tokens` "
        "(all of it, OpenAI's rule). Settled to real usage either way; per key too.",
    )
    output_percentile: float = Field(
        0.95,
        gt=0,
        le=1,
        description="Percentile of a key's last 100 completions (per model) reserved when "
        "`reserve_output` is `estimate`.",
    )
    max_concurrent: PositiveInt | None = Field(
        None,
        description="Default most requests a key has in flight at once (streams count until "
        "they end); more wait in the queue up to `max_queue_wait_ms`, then 503. Unset: no cap.",
    )


class RetryPolicyConfig(Section):
    max_attempts: int | None = Field(
        None,
        ge=1,
        le=10,
        description="Upstream attempts per model (first try included). Wins over "
        "`token_scheduler.max_retries`.",
    )
    backoff_ms: PositiveInt = Field(
        500, description="Base of the exponential backoff (full jitter) between attempts."
    )
    max_backoff_ms: PositiveInt = Field(8000, description="Cap of one backoff wait.")
    max_retry_after_ms: PositiveInt = Field(
        20000,
        description="Longest upstream `Retry-After` honoured; a longer one ends retrying at once.",
    )
    budget_ratio: float = Field(
        0.2,
        ge=0,
        le=10,
        description="Retry budget per domain: retries may add at most this fraction of the "
        "requests seen in `budget_window_sec` (plus `budget_min_retries`).",
    )
    budget_window_sec: PositiveInt = Field(10, description="Sliding window of the retry budget.")
    budget_min_retries: int = Field(
        10, ge=0, description="Retries always allowed per window, so a quiet domain can retry."
    )
    client_retries: Literal["cooperate", "client"] = Field(
        "cooperate",
        description="`cooperate`: the gateway retries and tells SDKs not to repeat it "
        "(`x-should-retry: false`); `client`: one gateway attempt, retries left to clients.",
    )
    retry_unanswered: bool = Field(
        False,
        description="Also re-send a request the upstream may have acted on (it was written, "
        "then the connection broke, went silent or answered garbage), here or on a fallback. "
        "Off: such a request is answered 502/504 with `x-should-retry: false`, because a "
        "re-send may run, and bill, it twice; on: availability first, it MAY BILL TWICE.",
    )


class HealthCheckConfig(Section):
    enabled: bool = Field(True, description="Probe each domain in the background.")
    interval_sec: float = Field(30, gt=0, description="Seconds between probes of a domain.")
    endpoint: str = Field("/v1/models", description="Upstream path probed (GET, with the key).")
    timeout_ms: PositiveInt = Field(5000, description="Timeout of one probe.")


class BreakerConfig(Section):
    failure_threshold: PositiveInt = Field(
        5, description="Consecutive upstream failures that open a domain's circuit."
    )
    failure_rate: float = Field(
        0.5, gt=0, le=1, description="Failure fraction over the window that opens the circuit."
    )
    window_sec: PositiveInt = Field(30, description="Window of the failure-rate rule.")
    min_requests: PositiveInt = Field(
        20, description="Requests in the window before the failure-rate rule applies."
    )
    open_sec: float = Field(
        10, gt=0, description="Seconds a circuit stays open before a half-open probe."
    )


class BudgetConfig(Section):
    period: Literal["day", "week", "month", "total"] = Field(
        description="Calendar period the budget counts over, in `billing.timezone`: `day` "
        "(from local midnight), `week` (ISO week, from Monday), `month` (from the 1st) or "
        "`total` (never resets)."
    )
    max_cost: Money | None = Field(
        None,
        description="Most spend per period, in `billing.currency` (cost from `billing.prices`).",
    )
    max_tokens: PositiveInt | None = Field(
        None, description="Most tokens per period (prompt + completion, cached counted once)."
    )

    @model_validator(mode="after")
    def _some_limit(self) -> BudgetConfig:
        if self.max_cost is None and self.max_tokens is None:
            raise ValueError("a budget needs `max_cost` or `max_tokens` (or both)")
        return self


class KeyConfig(Section):
    alias: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description="Name of the key in metrics, logs and the ledger (never the secret).",
    )
    key_sha256: str | list[str] = Field(
        description="SHA-256 hex of the key (`tokengate keys new`); a list during rotation.",
    )
    tokens_per_minute: PositiveInt | None = Field(None, description="Overrides the default.")
    requests_per_minute: PositiveInt | None = Field(None, description="Overrides the default.")
    priority: Priority = Field(Priority.NORMAL, description="Queue class: high, normal or low.")
    models: list[str] | None = Field(None, description="Models this key may use; unset = all.")
    domain: DomainName | None = Field(None, description="Pin this key to one domain.")
    reserve_output: ReserveOutput | None = Field(
        None, description="Overrides `rate_limit.reserve_output` for this key."
    )
    max_concurrent: PositiveInt | None = Field(
        None, description="Overrides `rate_limit.max_concurrent` for this key."
    )
    expires_at: datetime | None = Field(
        None, description="After this instant (ISO 8601, UTC if no zone) the key gets 401."
    )
    team: TeamName | None = Field(
        None,
        description="The team (one of `teams`) this key belongs to: its spend also counts "
        "against the team's budgets, and reports can group by team.",
    )
    budgets: list[BudgetConfig] = Field(
        default_factory=list,
        description="This key's budgets (`period` and `max_cost` and/or `max_tokens`); past one "
        "the key gets 429 `budget_exceeded` until the period resets.",
    )

    @field_validator("key_sha256")
    @classmethod
    def _hex_digest(cls, value: str | list[str]) -> str | list[str]:
        for digest in [value] if isinstance(value, str) else value:
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise ValueError("must be 64 lowercase hex characters (a SHA-256 digest)")
        return value

    def digests(self) -> tuple[str, ...]:
        return (self.key_sha256,) if isinstance(self.key_sha256, str) else tuple(self.key_sha256)


class AffinityConfig(Section):
    enabled: bool = Field(
        True,
        description="Send the requests of one conversation to the same domain (its upstream "
        "prompt cache then serves their shared prefix) while it is available and not "
        "overloaded; off: the least expected wait.",
    )
    load_factor: float = Field(
        1.25,
        ge=1,
        le=10,
        description="A domain holding more than this many times its weighted share of the "
        "active conversations takes no new ones (they go to their next choice); one request "
        "of a conversation goes elsewhere while its domain has requests queued and is this "
        "far over its share of the outstanding requests.",
    )


class RedisConfig(Section):
    url: SecretStr | None = Field(
        None,
        description="Redis shared by replicas (`TOKENGATE_REDIS_URL`): `redis://host:6379/0`, "
        "`rediss://` (TLS), `unix:///path/redis.sock`, "
        "`redis+sentinel://h1:26379,h2:26379/service`, `redis+cluster://h1:6379,h2:6379`; "
        "unset (and no `sentinels`) keeps limits in-process.",
    )
    password: SecretStr | None = Field(
        None,
        description="Password of the Redis servers (`TOKENGATE_REDIS__PASSWORD`); wins over one "
        "in `url`, so the URL can live in a config file and the secret elsewhere.",
    )
    sentinels: list[str] = Field(
        default_factory=list,
        description="Sentinel addresses (`host:port`, JSON list in the environment) watching "
        "`sentinel_service`; the gateway follows the master they name, through failovers. "
        "The alternative to a `redis+sentinel://` URL.",
    )
    sentinel_service: str | None = Field(
        None, description="Name of the master the Sentinels monitor (`sentinel monitor NAME`)."
    )
    sentinel_password: SecretStr | None = Field(
        None,
        description="Password of the Sentinels themselves (`requirepass` in sentinel.conf), "
        "when they have one; the master's is `password` or the URL's.",
    )
    cluster: bool = Field(
        False,
        description="`url` is a seed node of a Redis Cluster (same as `redis+cluster://`). Every "
        "script's keys share one hash slot, so no call is ever cross-slot.",
    )
    tls_ca_file: str | None = Field(
        None,
        description="CA bundle (PEM) that signed the Redis server's certificate (`rediss://`); "
        "unset: the system's CAs.",
    )
    tls_cert_file: str | None = Field(
        None, description="Client certificate (PEM) when Redis asks for one (`tls-auth-clients`)."
    )
    tls_key_file: str | None = Field(None, description="Private key (PEM) of `tls_cert_file`.")
    tls_verify_hostname: bool = Field(
        True,
        description="Check that the server certificate names the host connected to. Off only "
        "for servers reached by an address their certificate does not list.",
    )
    fail_mode: Literal["open", "closed"] = Field(
        "open",
        description="Redis unreachable: `open` keeps serving, each replica enforcing every "
        "limit and domain quota divided by the replicas seen alive in the last minute; "
        "`closed` answers 503 `redis_unavailable` (and readiness fails).",
    )
    assumed_replicas: PositiveInt = Field(
        1,
        description="While Redis is unreachable each replica enforces limit / max(replicas seen "
        "alive in the last minute, this). Set it to the usual replica count so a replica that "
        "started during an outage (it has seen nobody) does not enforce a whole limit alone.",
    )
    key_prefix: str = Field(
        "tokengate:",
        pattern=r"^[^{}]*$",
        description="Prefix of every Redis key (no braces: they would change the hash slot).",
    )
    timeout_ms: PositiveInt = Field(
        250,
        description="Timeout of one Redis round trip. Redis answers in well under 1 ms; the "
        "rest is this process being late to read under load. Three timeouts in a row (or a "
        "refused connection) count as Redis being unreachable.",
    )
    connect_timeout_ms: PositiveInt = Field(
        1000,
        description="Timeout of opening one connection (TCP, TLS handshake, AUTH); apart from "
        "`timeout_ms` because a TLS handshake under a burst takes longer than a command.",
    )
    max_connections: PositiveInt = Field(
        64,
        description="Redis connections per process (per node with Cluster). Calls are batched, "
        "so a process rarely holds more than a few.",
    )

    @property
    def enabled(self) -> bool:
        return self.url is not None or bool(self.sentinels)

    @model_validator(mode="after")
    def _target(self) -> RedisConfig:
        target = self.target()  # a bad URL stops the start, with no secret in the message
        tls_files = (self.tls_ca_file, self.tls_cert_file, self.tls_key_file)
        if any(tls_files) and (target is None or not target.tls):
            raise ValueError("redis.tls_* apply to TLS connections: use a rediss:// URL")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("redis.tls_cert_file and redis.tls_key_file go together")
        return self

    def target(self) -> RedisTarget | None:
        """Where Redis is (None: not configured)."""
        try:
            return parse_target(
                None if self.url is None else self.url.get_secret_value(),
                sentinels=self.sentinels,
                sentinel_service=self.sentinel_service,
                cluster=self.cluster,
                password=None if self.password is None else self.password.get_secret_value(),
            )
        except TargetError as exc:
            raise ValueError(str(exc)) from None


class ServerConfig(Section):
    max_body_bytes: PositiveInt = Field(
        8 * 1024 * 1024, description="Largest request body accepted; larger gets 413."
    )
    max_header_bytes: PositiveInt = Field(
        64 * 1024, description="Largest total size of a request's headers; larger gets 431."
    )
    max_headers: PositiveInt = Field(
        128, description="Most headers a request may carry; more gets 431."
    )
    drain_timeout_sec: float = Field(
        30, ge=0, description="On SIGTERM, how long in-flight and queued work may finish."
    )
    drain_delay_sec: float = Field(
        0,
        ge=0,
        le=60,
        description="On SIGTERM, seconds to keep serving with readiness at 503 before "
        "closing the listener (lets a load balancer stop sending first).",
    )
    upstream_client: Literal["aiohttp", "native", "httpx"] = Field(
        "aiohttp",
        description="Upstream HTTP client: always aiohttp. `native` and `httpx` (clients of "
        "earlier versions) still load, as aliases of `aiohttp`, with a warning at start.",
    )


class DatabaseConfig(Section):
    url: SecretStr | None = Field(
        None,
        description="PostgreSQL URL shared by every replica (`TOKENGATE_DATABASE_URL`; "
        "`postgresql://user:password@host:5432/tokengate`, `postgres://` and "
        "`?sslmode=require` accepted). Unset: the embedded SQLite file at `database.path`.",
    )
    path: str = Field(
        "var/tokengate.sqlite3",
        description="SQLite file of the durable state (usage ledger, batches, files, live "
        "key limits) when `database.url` is unset; its directory is created. One node only: "
        "replicas on several hosts need `database.url`.",
    )
    pool_size: PositiveInt = Field(5, description="PostgreSQL connections each process keeps open.")
    max_overflow: int = Field(
        5, ge=0, description="Extra PostgreSQL connections a burst may open beyond `pool_size`."
    )
    connect_timeout_sec: float = Field(
        5, gt=0, le=120, description="Timeout of opening one database connection."
    )
    statement_timeout_sec: float = Field(
        30,
        gt=0,
        description="Longest one database statement may run (PostgreSQL), or wait for the "
        "file lock (SQLite busy timeout).",
    )


class LedgerConfig(Section):
    path: str | None = Field(
        None,
        description="Deprecated and ignored: the ledger lives in the database "
        "(`database.path`, or `database.url`). Still accepted so older files load.",
    )
    flush_interval_sec: float = Field(
        1.0,
        gt=0,
        le=60,
        description="How often settled requests are written to the database (one transaction "
        "per flush). A `kill -9` loses at most this much; SIGTERM loses nothing.",
    )
    max_buffered_rows: PositiveInt = Field(
        500_000,
        description="Most unwritten ledger rows (one per minute, key, model, domain and "
        "status) kept in memory while the database is unreachable; past it new rows are "
        "dropped and counted in `tokengate_ledger_dropped_total`.",
    )
    minute_retention_days: PositiveInt = Field(
        14,
        description="Minute buckets older than this are rolled up into hour buckets.",
    )
    hour_retention_days: int = Field(
        0,
        ge=0,
        description="Hour buckets older than this are deleted; 0 keeps them forever.",
    )


class BatchConfig(Section):
    path: str | None = Field(
        None,
        description="Deprecated and ignored: files, batches and their items live in the "
        "database (`database.path`, or `database.url`). Still accepted so older files load.",
    )
    max_file_bytes: PositiveInt = Field(
        100 * 1024 * 1024, description="Largest `POST /v1/files` upload; larger gets 413."
    )
    max_items: PositiveInt = Field(50000, description="Most requests in one batch.")
    concurrency: PositiveInt = Field(
        16, description="Items of one batch in flight at once from one process."
    )
    share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="Fraction of a domain's `max_inflight` batch items may hold; interactive "
        "traffic always keeps the rest and is always dispatched first.",
    )
    lease_sec: float = Field(
        10,
        gt=0,
        description="A batch is owned by one process for this long, renewed while "
        "it runs; after a crash another replica (or the restart) takes it over. Measured "
        "on the database's clock, so replicas' clocks need not agree.",
    )


class UiConfig(Section):
    enabled: bool = Field(
        True,
        description="Serve the live status page at `/ui` (its data, `/admin/ui/snapshot`, needs "
        "the admin key). Off: both answer 404 and no recent traffic is kept in memory.",
    )
    step_sec: int = Field(
        5,
        ge=1,
        le=60,
        description="Seconds per point of the status page's 15-minute charts (900 / step_sec "
        "points per series, kept in a fixed-size ring in each process).",
    )


class ResponsesConfig(Section):
    websocket: bool = Field(
        True,
        description="Serve the Responses WebSocket mode on `GET /v1/responses` (what Codex "
        "CLI tries first), bridged to the domains over HTTP + SSE. False (or no domain "
        "serving the Responses API) answers the upgrade with 426, so clients fall back to "
        "HTTP at once.",
    )
    id_ttl_sec: PositiveInt = Field(
        30 * 24 * 3600,
        description="How long the gateway remembers which domain (and key) created a stored "
        "response, for `previous_response_id` and `/v1/responses/{id}` (in Redis when "
        "configured, so every replica knows; OpenAI keeps responses 30 days).",
    )
    max_local_ids: PositiveInt = Field(
        100_000,
        description="Response ids each process keeps in memory (least recently used dropped "
        "first); with Redis this is only a cache in front of it.",
    )
    websocket_cached_responses: int = Field(
        4,
        ge=1,
        le=64,
        description="Responses each WebSocket connection keeps (input and output items) so a "
        "`response.create` with `previous_response_id` and only the new items can be sent to "
        "a stateless upstream in full.",
    )


class TracingConfig(Section):
    enabled: bool = Field(
        False,
        description="Export an OpenTelemetry trace of each request over OTLP/HTTP: a span per "
        "request (GenAI attributes), one per queue wait and one per upstream attempt. Needs "
        "`pip install 'tokengate[otel]'` (in the container image). Off: nothing is loaded.",
    )
    endpoint: str | None = Field(
        None,
        description="OTLP/HTTP traces URL, e.g. `http://collector:4318/v1/traces`. Unset: "
        "`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else `OTEL_EXPORTER_OTLP_ENDPOINT` + "
        "`/v1/traces`, else `http://localhost:4318/v1/traces`.",
    )
    service_name: str | None = Field(
        None,
        description="`service.name` of the spans. Unset: `OTEL_SERVICE_NAME`, else `tokengate`.",
    )
    sample_ratio: float = Field(
        1.0,
        ge=0,
        le=1,
        description="Share of requests traced. A client's `traceparent` decides for its own "
        "requests (sampled or not), as W3C propagation expects.",
    )
    headers: SecretStr | None = Field(
        None,
        description="Headers of each export, `name=value,name2=value2` (a tracing service's "
        "key): a secret, give it as `${VAR}` in settings.json or the environment. Unset: "
        "`OTEL_EXPORTER_OTLP_TRACES_HEADERS` / `OTEL_EXPORTER_OTLP_HEADERS`.",
    )
    propagate: bool = Field(
        True,
        description="Send each upstream attempt's `traceparent` upstream, so an upstream that "
        "traces joins the request's trace. Off: no trace header leaves the gateway.",
    )


class PriceConfig(Section):
    input: Money = Field(description="Price of a million prompt tokens (not cached).")
    output: Money = Field(description="Price of a million completion tokens (reasoning included).")
    cached_input: Money | None = Field(
        None,
        description="Price of a million prompt tokens read from the upstream's prompt cache; "
        "unset: the `input` price.",
    )
    cache_write: Money | None = Field(
        None,
        description="Price of a million prompt tokens written to the prompt cache (Anthropic's "
        "cache creation); unset: the `input` price.",
    )


class BillingConfig(Section):
    currency: str = Field(
        "USD",
        pattern=r"^[A-Z]{3}$",
        description="ISO 4217 code every price and `max_cost` is in (`USD`, `CNY`, ...).",
    )
    timezone: str = Field(
        "UTC",
        description="IANA time zone of the calendar periods (budgets' day/week/month, daily "
        "reports), e.g. `Asia/Shanghai`.",
    )
    prices: dict[str, PriceConfig] = Field(
        default_factory=dict,
        description="Prices per model (the name after `model_aliases`), per million tokens: "
        '`{"gpt-4o": {"input": 2.5, "output": 10, "cached_input": 1.25}}`. A model without '
        "a price is warned about at start; its cost is recorded as unknown.",
    )

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"unknown time zone {value!r}: use an IANA name such as UTC or Asia/Shanghai"
            ) from None
        return value


class TeamConfig(Section):
    name: TeamName = Field(description="Team name, referred to by keys' `team`.")
    budgets: list[BudgetConfig] = Field(
        default_factory=list,
        description="The team's budgets: the spend of all its keys together.",
    )


class Settings(BaseSettings):
    """The whole configuration. Paths are bound by `app.config.sources.load_settings`."""

    model_config = SettingsConfigDict(
        extra="forbid",
        frozen=True,
        allow_inf_nan=False,
        env_prefix="TOKENGATE_",
        env_nested_delimiter="__",
        case_sensitive=False,
    )

    # config.toml (seed)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    token_scheduler: TokenSchedulerConfig = Field(default_factory=TokenSchedulerConfig)
    scale_up: ScaleUpConfig | list[ScaleUpConfig] | None = Field(
        None, description="One Scale-up domain (table) or several (`[[scale_up]]` array)."
    )
    scale_out: ScaleOutConfig = Field(default_factory=ScaleOutConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)

    # settings.json (seed)
    api_endpoint: str | None = Field(
        None, description="Upstream base URL; wins over `token_scheduler.api_base`."
    )
    api_key: SecretStr | None = Field(
        None,
        description="Default upstream key, normally `${TAOTOKEN_API_KEY}` expanded from the "
        "environment. Not settable as TOKENGATE_API_KEY (that name is the client key of "
        "`tokengate check`).",
    )
    model_route: ModelRouteConfig = Field(default_factory=ModelRouteConfig)
    rate_limit: RateLimitConfig = Field(default_factory=RateLimitConfig)
    retry_policy: RetryPolicyConfig = Field(default_factory=RetryPolicyConfig)
    health_check: HealthCheckConfig = Field(default_factory=HealthCheckConfig)

    # added by tokengate
    keys: list[KeyConfig] = Field(default_factory=list, description="Gateway client keys.")
    admin_key: SecretStr | None = Field(
        None, description="Key guarding `/admin/*` (`TOKENGATE_ADMIN_KEY`); unset disables them."
    )
    model_aliases: dict[str, str] = Field(
        default_factory=dict,
        description="Client-facing model names mapped to upstream ids, applied before routing.",
    )
    breaker: BreakerConfig = Field(default_factory=BreakerConfig)
    affinity: AffinityConfig = Field(default_factory=AffinityConfig)
    redis: RedisConfig = Field(default_factory=RedisConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    database: DatabaseConfig = Field(default_factory=DatabaseConfig)
    ledger: LedgerConfig = Field(default_factory=LedgerConfig)
    batch: BatchConfig = Field(default_factory=BatchConfig)
    ui: UiConfig = Field(default_factory=UiConfig)
    responses: ResponsesConfig = Field(default_factory=ResponsesConfig)
    billing: BillingConfig = Field(default_factory=BillingConfig)
    teams: list[TeamConfig] = Field(
        default_factory=list, description="Teams: a name and its budgets; keys join with `team`."
    )
    tracing: TracingConfig = Field(default_factory=TracingConfig)
