"""Every request on the record, refused ones included: one access-log line, one sample.

The pipeline records what it handles (`Pipeline._log`: planned, admitted, dispatched).
Whatever is answered before it, or without it, is recorded here, in one place, when
the response has gone: the 431 of the request context, the edge's 405, 401, 413 and
400, and every answer of a FastAPI route under `/v1/` (models, files, batches) plus
every refusal of the others (admin 401/404/409, unknown routes, wrong methods).
Probes and scrapes (`/health`, `/health/ready`, `/metrics`) are not client requests
and write nothing, whatever they answer.

    RequestContext ── puts an `AccessNote` in scope["state"]["access"]
      └► routes fill it as they learn: the caller's alias (after authentication), the
         model (after parsing), the error (`refused`), or `handled` once the pipeline
         owns the request (it writes its own line then)
    RequestContext ── response sent ──► `AccessRecorder.record(...)` unless handled

The line has the pipeline line's fields; `key` is the caller's alias, or "anonymous"
while none was established (a missing or wrong key is never written, only its error
code), and `domain` is "none": no domain was chosen for a request refused here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from starlette.types import Scope

from app.errors import GatewayError, KeyExpired
from app.log import log_fields
from app.metrics import Metrics
from app.pipeline.accounting import NO_DOMAIN, access_log
from app.pipeline.trace import Trace
from app.runtime import KeySpec
from app.status.recent import RecentFailure

ANONYMOUS = "anonymous"
_LEFT = "the client closed the connection before the answer ended"
CLIENT_CLOSED = 499  # nginx's status for a client that left before its answer
_QUIET = frozenset({"/health", "/health/ready", "/metrics"})


class AccessNote:
    """What the layers of one request learned about it, for its access-log line."""

    __slots__ = ("endpoint", "error", "handled", "key", "message", "model", "team")

    def __init__(self) -> None:
        self.key = ANONYMOUS
        self.team: str | None = None
        self.endpoint: str | None = None
        self.model: str | None = None
        self.error: str | None = None
        self.message: str | None = None  # the refusal's own message (written for clients)
        self.handled = False  # the pipeline writes this request's line itself


def note_of(scope: Scope) -> AccessNote | None:
    state: dict[str, Any] | None = scope.get("state")
    return None if state is None else state.get("access")


def identify(scope: Scope, key: KeySpec) -> None:
    """The caller authenticated as `key`."""
    if (note := note_of(scope)) is not None:
        note.key, note.team = key.alias, key.team


def refused(scope: Scope, exc: GatewayError) -> None:
    """The request is answered with `exc`: its code goes on the line (an expired key's
    alias too: the key was right, only late)."""
    if (note := note_of(scope)) is not None:
        note.error = exc.code or exc.type
        note.message = exc.message
        if isinstance(exc, KeyExpired):
            note.key = exc.alias


class AccessRecorder:
    def __init__(self, metrics: Metrics, currency: Callable[[], str] = lambda: "USD") -> None:
        self.metrics = metrics
        self.currency = currency  # billing.currency in force (a reload may change it)

    def wanted(self, method: str, path: str, status: int) -> bool:
        if path in _QUIET and method in ("GET", "HEAD"):
            return False
        return status >= 400 or path.startswith("/v1/")

    def record(
        self, scope: Scope, note: AccessNote, request_id: str, status: int | None, ms: float
    ) -> None:
        """One line and one `tokengate_requests_total` sample for a request nothing else
        recorded (`status` None: the client left before any answer)."""
        code = CLIENT_CLOSED if status is None else status
        path: str = scope.get("path", "")
        if note.handled or not self.wanted(scope.get("method", ""), path, code):
            return
        error = note.error or ("client_closed" if status is None else None)
        self.metrics.record_refused(NO_DOMAIN, note.model, code)
        if code >= 400:  # the status page's recent errors, as the pipeline's are
            message = note.message or (_LEFT if status is None else f"HTTP {code}")
            failure = RecentFailure(request_id, note.key, note.model, None, code, error, message)
            self.metrics.record_error(failure)
        if access_log.isEnabledFor(logging.INFO):
            fields = _fields(note, request_id, code, error, ms)
            fields["currency"] = self.currency()
            log_fields(access_log, "request", fields)


def _fields(
    note: AccessNote, request_id: str, status: int, error: str | None, ms: float
) -> dict[str, object]:
    """The pipeline line's fields, from the pipeline's own `Trace` (so both stay one
    schema), for a request that reached no domain and consumed nothing."""
    trace = Trace(request_id, note.key, note.endpoint or "", note.model, False, 0.0)
    trace.status, trace.error = status, error
    fields = trace.fields(ms)
    fields["cost"] = "0"  # refused before admission: nothing consumed, as the pipeline says
    fields["team"] = note.team
    fields["window"] = None  # nothing consumed, so priced in no billing window
    return fields
