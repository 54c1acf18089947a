"""Background probe of one domain's upstream: `GET health_check.endpoint` with its key.

A 2xx says healthy; when the endpoint is `/v1/models` the listed ids are the domain's
discovered models (used unless the config lists `models`). Anything else says
unhealthy with a short reason that `/health/ready` shows. The probe only reports: the
domain applies the result (`Domain.record_probe`), so this package never imports the
dispatch side.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import orjson

from app.upstream.attempt import AttemptFailed
from app.upstream.cause import Failure, address, of_status
from app.upstream.client import UpstreamClient


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    at: float
    detail: str = ""
    status: int | None = None
    models: frozenset[str] | None = None  # the ids a 2xx listed, if it was a model list
    failure: Failure | None = None  # why it failed, with the upstream's address


async def probe(client: UpstreamClient, endpoint: str, request_id: str) -> ProbeResult:
    try:
        resp = await client.send(endpoint, None, stream=False, method="GET", request_id=request_id)
        body = await resp.read()
    except AttemptFailed as failed:
        why = failed.failure(address(client.domain.api_base))
        detail = why.summary if why is not None else failed.reason.value
        return ProbeResult(False, time.monotonic(), detail, failure=why)
    ok = 200 <= resp.status < 300
    if ok:
        return ProbeResult(True, time.monotonic(), "ok", resp.status, _model_ids(body))
    why = Failure(of_status(resp.status), address(client.domain.api_base), resp.status)
    return ProbeResult(False, time.monotonic(), _why(resp.status), resp.status, failure=why)


def _why(status: int) -> str:
    if status == 401:
        return "401: the upstream rejected the domain's key (is its api_key_env set right?)"
    if status == 403:
        return "403: the domain's key lacks the scope for this endpoint"
    if status == 429:
        return "429: the domain's upstream quota is exhausted"
    return f"status {status}"


def _model_ids(body: bytes) -> frozenset[str] | None:
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    data = obj.get("data") if isinstance(obj, dict) else None
    if not isinstance(data, list):
        return None
    return frozenset(m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str))
