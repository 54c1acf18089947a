"""`/health`, `/health/ready` and `/metrics`: what orchestrators and scrapers read."""

from __future__ import annotations

import httpx

from tests.support.inproc import MakeClient, gateway_of


async def test_liveness_is_a_fixed_body(client: httpx.AsyncClient) -> None:
    r = await client.get("/health")
    assert r.status_code == 200 and r.content == b'{"status":"ok"}'


async def test_readiness_lists_each_domain_with_its_breaker(client: httpx.AsyncClient) -> None:
    r = await client.get("/health/ready")
    assert r.status_code == 200
    assert r.content.startswith(
        b'{"status":"ready","domains":{"default":{"state":"unknown","breaker":"closed",'
        b'"api_base":"https://taotoken.net/api","models":null,"queue_depth":0,"inflight":0,'
        b'"max_inflight":64,"pace":{"shared":false,"requests_per_sec":null,"learned":false,'
        b'"cooldown_sec":0.0},"last_probe":null,"last_failure":null}},'
        b'"routes":{"unresolved":[],"unverified":[]},'
        b'"database":{"backend":"sqlite","where":"sqlite:/'
    )
    database = r.json()["database"]
    assert database["where"].endswith("/tokengate.sqlite3")
    assert (database["up"], database["error"], database["ledger_backlog_rows"]) == (True, None, 0)


async def test_readiness_is_503_once_every_domain_is_unavailable(
    make_client: MakeClient,
) -> None:
    client = await make_client({"breaker": {"failure_threshold": 1}})
    for domain in gateway_of(client).domains:
        domain.breaker.record(False)
    r = await client.get("/health/ready")
    assert r.status_code == 503
    body = r.json()
    assert body["status"] == "unavailable"
    assert body["domains"]["default"]["breaker"] == "open"


async def test_metrics_are_prometheus_text(client: httpx.AsyncClient) -> None:
    r = await client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert "tokengate_queue_depth" in r.text


async def test_readiness_never_shows_the_credentials_of_an_upstream_url(
    make_client: MakeClient,
) -> None:
    client = await make_client({"api_endpoint": "http://tg:hunter2@10.0.0.7:9090/api"})
    r = await client.get("/health/ready")
    assert (
        r.json()["domains"]["default"]["api_base"] == "http://tg:***@10.0.0.7:9090/api"
    )  # the one redaction (app.log)
    assert b"hunter2" not in r.content
