"""One client request as the pipeline sees it: parsed just enough, passed through whole.

The gateway reads only the fields it needs (model, stream, max_tokens, n, the prompt
for an estimate) and forwards the client's bytes untouched unless it must change
something: the model (default route, alias, fallback) or `stream_options` (to get
usage from a stream). Unknown fields always pass through.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from app.kinds import QueueClass, ServiceTier
from app.pipeline.conversation import session_key
from app.runtime import KeySpec
from app.upstream.websocket import UpstreamSockets


@dataclass(frozen=True)
class Endpoint:
    name: str
    path: str
    streamable: bool
    anthropic: bool = False
    usage_in_stream: bool = True  # accepts stream_options.include_usage
    generates: bool = True  # False: answered without generation (no limits, no queue)
    responses: bool = False  # OpenAI's Responses API: usage in `response.completed`, ids


CHAT = Endpoint("chat", "/v1/chat/completions", streamable=True)
COMPLETIONS = Endpoint("completions", "/v1/completions", streamable=True)
EMBEDDINGS = Endpoint("embeddings", "/v1/embeddings", streamable=False)
MESSAGES = Endpoint(
    "messages", "/v1/messages", streamable=True, anthropic=True, usage_in_stream=False
)
COUNT_TOKENS = Endpoint(
    "count_tokens",
    "/v1/messages/count_tokens",
    streamable=False,
    anthropic=True,
    usage_in_stream=False,
    generates=False,
)
RESPONSES = Endpoint(
    "responses", "/v1/responses", streamable=True, usage_in_stream=False, responses=True
)
# The same API reached through the WebSocket mode: each `response.create` message is one
# request; its own name keeps the two apart in the access log.
RESPONSES_SOCKET = Endpoint(
    "responses_ws", "/v1/responses", streamable=True, usage_in_stream=False, responses=True
)
RESPONSES_COMPACT = Endpoint(
    "responses_compact",
    "/v1/responses/compact",
    streamable=False,
    usage_in_stream=False,
    responses=True,
)


@dataclass(slots=True, init=False)
class ClientRequest:
    """(The `__init__` is written out, not generated: one is built per request, and the
    compiled build runs a written one as C, a generated one as Python: 9,700 instructions
    against a few hundred; deploy/BENCHMARKS.md, issue #32's sixth pass.)"""

    endpoint: Endpoint
    key: KeySpec
    request_id: str
    raw: bytes
    body: dict[str, Any]
    model: str | None
    stream: bool
    max_tokens: int | None
    prompt_tokens: int
    choices: int
    client_headers: Mapping[str, str]
    started: float
    priority: QueueClass | None  # overrides the key's class (batch items: BATCH)
    session_header: str | None  # x-session-id (or Claude Code's own) if sent
    session_label: str  # the agent session it is accounted under (limits/sessions.py)
    service_tier: ServiceTier | None  # asked for or forced by the key (wire.py)

    # Responses API: the only domain that can serve it (it holds `previous_response_id`),
    # and who to tell the id of the response the answer created (id, serving domain),
    # awaited before the client sees that id.
    home: str | None
    on_response: Callable[[str, str], Awaitable[None]] | None
    # A client WebSocket's own upstream sockets (domains with responses_websocket).
    sockets: UpstreamSockets | None
    # The client's W3C trace headers (read only while tracing is on), and whether the
    # pipeline took the request (then it writes the request's access-log line itself).
    trace_context: Mapping[str, str] | None
    in_pipeline: bool
    # `max_tokens` is the output cap the gateway sends upstream (allowance.py): the
    # budgets held less than the client asked, or the client asked no cap
    send_cap: bool
    _session: bytes | None

    def __init__(
        self,
        endpoint: Endpoint,
        key: KeySpec,
        request_id: str,
        raw: bytes,
        body: dict[str, Any],
        model: str | None,
        stream: bool,
        max_tokens: int | None,
        prompt_tokens: int,
        choices: int = 1,
        client_headers: Mapping[str, str] | None = None,
        started: float = 0.0,
        priority: QueueClass | None = None,
        session_header: str | None = None,
        session_label: str = "-",
        service_tier: ServiceTier | None = None,
        home: str | None = None,
        on_response: Callable[[str, str], Awaitable[None]] | None = None,
        sockets: UpstreamSockets | None = None,
        trace_context: Mapping[str, str] | None = None,
        in_pipeline: bool = False,
        send_cap: bool = False,
    ) -> None:
        self.endpoint = endpoint
        self.key = key
        self.request_id = request_id
        self.raw = raw
        self.body = body
        self.model = model
        self.stream = stream
        self.max_tokens = max_tokens
        self.prompt_tokens = prompt_tokens
        self.choices = choices
        self.client_headers = {} if client_headers is None else client_headers
        self.started = started
        self.priority = priority
        self.session_header = session_header
        self.session_label = session_label
        self.service_tier = service_tier
        self.home = home
        self.on_response = on_response
        self.sockets = sockets
        self.trace_context = trace_context
        self.in_pipeline = in_pipeline
        self.send_cap = send_cap
        self._session = None

    @property
    def session(self) -> bytes:
        """The conversation this request belongs to (conversation.py), read on first use (a
        slotted record has no `__dict__` for `functools.cached_property`)."""
        if self._session is None:
            self._session = session_key(self.body, self.session_header)
        return self._session

    @property
    def background(self) -> bool:
        """A Responses API background response (answered `queued`, charged up front)."""
        return self.endpoint.responses and self.body.get("background") is True

    @property
    def queue_class(self) -> QueueClass:
        return self.priority or QueueClass.of(self.key.priority)

    @property
    def client_wants_usage(self) -> bool:
        opts = self.body.get("stream_options")
        return isinstance(opts, dict) and opts.get("include_usage") is True

    @property
    def strip_usage(self) -> bool:
        """The gateway asked for stream usage itself, so the client must not see it."""
        return self.stream and self.endpoint.usage_in_stream and not self.client_wants_usage

    def cost(self, default_max_tokens: int) -> int:
        if self.endpoint is EMBEDDINGS:
            return self.prompt_tokens
        completion = self.max_tokens if self.max_tokens is not None else default_max_tokens
        return self.prompt_tokens + completion * self.choices

    def _cap_fields(self) -> tuple[str, ...]:
        """Where this API takes the output cap (chat: the field(s) the client used)."""
        if self.endpoint.responses:
            return ("max_output_tokens",)
        if self.endpoint is CHAT:
            used = tuple(f for f in ("max_completion_tokens", "max_tokens") if f in self.body)
            return used or ("max_tokens",)
        return ("max_tokens",)

    def body_for(self, model: str, send_tier: bool = True) -> bytes:
        """The bytes to send upstream for `model`; the client's own when nothing changes.
        `send_tier`: the domain serves the request's `service_tier` itself, so it carries
        it (the key's forced tier in place of the asked one); else it has none."""
        inject = self.strip_usage
        tier = self.service_tier if send_tier else None
        same_tier = self.body.get("service_tier") == tier
        if model == self.body.get("model") and not inject and same_tier and not self.send_cap:
            return self.raw
        body = dict(self.body)
        body["model"] = model
        if self.send_cap:
            for name in self._cap_fields():
                body[name] = self.max_tokens
        if not same_tier:
            body.pop("service_tier", None)
            if tier is not None:
                body["service_tier"] = tier.value
        if inject:
            opts = body.get("stream_options")
            body["stream_options"] = {
                **(opts if isinstance(opts, dict) else {}),
                "include_usage": True,
            }
        return orjson.dumps(body)
