"""Background probe of one domain: `GET health_check.endpoint` with the domain's key.

A 2xx marks the domain healthy; when the endpoint is `/v1/models` the listed ids are
the domain's discovered models (used unless the config lists `models`). Anything
else marks it unhealthy with a short reason that `/health/ready` shows.
"""

from __future__ import annotations

import time

import orjson

from app.dispatch.domain import Domain, ProbeResult
from app.upstream.attempt import AttemptFailed


async def probe(domain: Domain, endpoint: str, request_id: str) -> ProbeResult:
    try:
        resp = await domain.client.send(
            endpoint, None, stream=False, method="GET", request_id=request_id
        )
        body = await resp.read()
    except AttemptFailed as failure:
        result = ProbeResult(False, time.monotonic(), failure.reason)
        domain.healthy, domain.last_probe = False, result
        return result
    ok = 200 <= resp.status < 300
    detail = "ok" if ok else _why(resp.status)
    result = ProbeResult(ok, time.monotonic(), detail, resp.status)
    domain.healthy, domain.last_probe = ok, result
    if ok:
        models = _model_ids(body)
        if models is not None:
            domain.upstream_models = models
            domain.discovered = models
    return result


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
