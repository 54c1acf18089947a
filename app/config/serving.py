"""How the gateway serves: request limits, browser origins, drain, the status page, the
Responses API's WebSocket mode and its memory, the metrics scrape, and tracing."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator

from app.config.section import PositiveInt, Section


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
    worker_start_timeout_sec: float = Field(
        30,
        ge=1,
        le=600,
        description="With `--workers N`: how long a new worker may take to start serving "
        "(after a SIGHUP or a crash) before the supervisor gives up on it and keeps the old "
        "one, and how long a worker may go without answering the supervisor's ping before "
        "it is killed as hung. uvicorn's own default, 5 s, aborted reloads on a loaded "
        "machine where importing and starting the gateway took longer.",
    )
    websocket_idle_timeout_sec: float = Field(
        300,
        gt=0,
        le=86400,
        description="A Responses WebSocket connection on which the client sends nothing for "
        "this long, with no response in flight, is closed (1001, reason `idle timeout`).",
    )
    max_websockets_per_key: PositiveInt = Field(
        16,
        description="Responses WebSocket connections one key may hold open at once, per "
        "process (a key's `max_websockets` overrides it; without Redis, each of N workers "
        "allows 1/N); one more is refused with 429 `websocket_connection_limit_reached`.",
    )
    allowed_origins: list[str] = Field(
        default_factory=list,
        description="Web origins (`scheme://host[:port]`, e.g. `https://chat.example.com`) "
        "whose pages may call the gateway from a browser, WebSocket included. Anything else "
        "sent by a browser (a foreign `Origin`, or a `Host` other than the gateway's own "
        "address, a localhost name or one of these origins' hosts) gets 403: SDKs and curl "
        "send no `Origin` and are not affected. `TOKENGATE_SERVER__ALLOWED_ORIGINS` takes a "
        "JSON list: `'[\"https://chat.example.com\"]'`.",
    )
    upstream_client: Literal["aiohttp", "native", "httpx"] = Field(
        "aiohttp",
        description="Upstream HTTP client: always aiohttp. `native` and `httpx` (clients of "
        "earlier versions) still load, as aliases of `aiohttp`, with a warning at start.",
    )

    @field_validator("allowed_origins")
    @classmethod
    def _origins(cls, value: list[str]) -> list[str]:
        return [_origin(v) for v in value]


def _origin(value: str) -> str:
    """An origin as browsers send it: lower case, no path, no default-port quirks kept."""
    parts = urlsplit(value.strip().lower())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{value!r} is not an origin: write scheme://host[:port]")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise ValueError(f"{value!r} is not an origin: no path, query or credentials")
    return f"{parts.scheme}://{parts.netloc}"


class MetricsConfig(Section):
    token: SecretStr | None = Field(
        None,
        description="Scrape token for `/metrics`: set, a scrape must send `Authorization: "
        "Bearer <token>` (Prometheus' `authorization` block) or gets 401. Unset: `/metrics` "
        "is open to whoever reaches the port (keep it on a private network).",
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
        "CLI tries first), each event relayed as one frame: over the domain's own WebSocket "
        "where it declares `responses_websocket`, else over HTTP + SSE. False (or no domain "
        "serving the Responses API) answers the upgrade with 426, so clients fall back to "
        "HTTP at once.",
    )
    id_ttl_sec: PositiveInt = Field(
        30 * 24 * 3600,
        description="How long the gateway keeps which key created a stored response, and "
        "which domain holds it (a row in the database, written before the client sees the "
        "id; OpenAI keeps responses 30 days). Only that key may read, chain, cancel or "
        "delete it; past this, the id is unknown to every key. Expired rows are deleted "
        "every minute and by `tokengate db prune`.",
    )
    max_local_ids: PositiveInt = Field(
        100_000,
        description="Response ids each process caches in memory (least recently used "
        "dropped first) in front of the database, which alone decides who owns an id.",
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
