"""The seed's `config.toml` sections: the cluster, its token scheduler, its Scale-up
domains (one table or a `[[scale_up]]` array), the scale-out network and logging."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from app.config.section import DomainName, PositiveInt, Section
from app.kinds import ApiStyle, ServiceTier


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
        30000,
        description="A request queued longer than this gets 503 with Retry-After (its key's "
        "`max_concurrent` line and a domain's queue count together).",
    )
    flex_max_queue_wait_ms: PositiveInt = Field(
        600000,
        description='How long a `service_tier: "flex"` request may wait for spare capacity on a '
        "domain that does not serve flex itself (it waits in the `batch` class), before its "
        "429 `resource_unavailable`. Flex clients should allow for it (OpenAI advises a "
        "15-minute timeout).",
    )
    max_inflight: int = Field(
        64,
        gt=0,
        le=100_000,
        description="Default limit of concurrent upstream requests per domain (a stream holds "
        "its slot until it ends).",
    )


# The comma-list API headers a client may send that a domain's policy can rewrite.
PolicedHeader = Literal["anthropic-beta", "openai-beta"]


class HeaderPolicyConfig(Section):
    drop: list[str] = Field(
        default_factory=list,
        description="Values never sent to this upstream: exact names or shell-style globs "
        "(`context-1m-*`), matched against each comma-separated value the client sent.",
    )
    rename: dict[str, str] = Field(
        default_factory=dict,
        description='Values sent under another name: `{"client-value" = "upstream-value"}`, '
        "exact names, applied after `drop`.",
    )
    allow: list[str] | None = Field(
        None,
        description="If set, only values matching one of these globs are sent (`*-2025-*`, "
        "`*-2026-*`, `claude-code-*`), after `rename`; the rest are dropped, not refused. "
        "Unset: every value passes.",
    )
    retry_refused: bool = Field(
        True,
        description="An upstream 400 whose error message names values that were sent "
        '("Unexpected value(s) `x` for the `anthropic-beta` header") is sent again once '
        "without them, and they are dropped from this domain's later requests until a "
        "reload (`tokengate_header_values_refused_total`).",
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
    responses: bool | Literal["chat"] = Field(
        True,
        description="The upstream (api_style `openai` or `both`) serves OpenAI's Responses API "
        "(`/v1/responses`); false keeps Responses traffic, and the WebSocket mode, off "
        'this domain; `"chat"`: it speaks only chat completions, and the gateway translates '
        "Responses requests onto `/v1/chat/completions` and the answers back (function, "
        "namespace, custom and tool_search tools included; nothing is stored upstream).",
    )
    responses_websocket: bool = Field(
        False,
        description="The upstream also serves the Responses WebSocket mode (OpenAI does): "
        "requests that reach the gateway over its WebSocket mode go on over a WebSocket of "
        "their own, one per client connection, sending only the new items while the "
        "upstream holds the conversation. False: HTTP + SSE, the whole conversation each time.",
    )
    headers: dict[PolicedHeader, HeaderPolicyConfig] = Field(
        default_factory=dict,
        description="What this upstream gets of the client's `anthropic-beta` / `openai-beta` "
        "values (`[scale_up.headers.anthropic-beta]`: `drop`, `rename`, `allow`, "
        "`retry_refused`). Unset: passed as sent, and a value the upstream refuses in a 400 "
        "is retried without.",
    )
    service_tiers: list[ServiceTier] = Field(
        default_factory=list,
        description="The `service_tier` values this domain's upstream serves itself (OpenAI: "
        '`["auto", "default", "flex", "priority"]`): a request asking for one is sent with it. '
        "A tier not listed is removed from the request and served by the gateway's classes "
        "(`priority`: high, `flex`: spare capacity only).",
    )
    defer_window: str | None = Field(
        None,
        description="What deferred work served by this domain waits for (batches of keys "
        "pinned to it, held background responses routed to it): a window of "
        "`billing.windows`, or `none` (idle upstream quota). A key's `defer_window` wins; "
        "unset: `batch.defer_window`.",
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
        description="Deprecated and ignored: prompt text never reaches the log (a privacy "
        "guarantee, `docs/security.md`). Still accepted so older files load, with a warning.",
    )

    @field_validator("level", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value
