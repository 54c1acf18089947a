"""`/admin/*`: off without an admin key, guarded with one, refusing what it cannot keep."""

from __future__ import annotations

import hashlib

import httpx

from tests.support.inproc import ADMIN_KEY, MakeClient

ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
ALICE = {"alias": "alice", "key_sha256": hashlib.sha256(b"tg-alice-key").hexdigest()}


async def test_without_an_admin_key_the_admin_api_does_not_exist(
    make_client: MakeClient,
) -> None:
    client = await make_client()
    r = await client.get("/admin/status", headers=ADMIN)
    assert r.status_code == 404
    assert r.json()["error"]["message"] == (
        "admin API disabled: set TOKENGATE_ADMIN_KEY to enable it"
    )


async def test_a_wrong_admin_key_is_401(client: httpx.AsyncClient) -> None:
    r = await client.get("/admin/status", headers={"authorization": "Bearer wrong"})
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "invalid_api_key"
    assert r.headers["x-should-retry"] == "false"


async def test_status_shows_domains_limits_and_breaker_states(client: httpx.AsyncClient) -> None:
    r = await client.get("/admin/status", headers=ADMIN)
    assert r.status_code == 200
    body = r.json()
    domain = body["domains"]["default"]
    assert domain["breaker"] == "closed" and domain["retry_budget"] == {
        "requests": 0,
        "retries": 0,
    }
    assert body["limits"]["store"]["kind"] == "memory" and body["workers"] == 1


async def test_usage_is_an_openai_style_list(client: httpx.AsyncClient) -> None:
    r = await client.get("/admin/usage", headers=ADMIN)
    assert r.status_code == 200 and r.json() == {"object": "list", "data": []}


async def test_live_limits_apply_to_a_known_alias(make_client: MakeClient) -> None:
    client = await make_client({"admin_key": ADMIN_KEY, "keys": [ALICE]})
    r = await client.put("/admin/keys/alice/limits", headers=ADMIN, json={"requests_per_minute": 7})
    assert r.status_code == 200
    assert r.json() == {
        "alias": "alice",
        "requests_per_minute": 7,
        "tokens_per_minute": 120000,
        "max_concurrent": None,
    }
    unknown = await client.put("/admin/keys/bob/limits", headers=ADMIN, json={})
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "alias"


async def test_live_limits_without_redis_under_workers_are_a_409(
    make_client: MakeClient,
) -> None:
    client = await make_client({"admin_key": ADMIN_KEY, "keys": [ALICE]}, workers=2)
    r = await client.put("/admin/keys/alice/limits", headers=ADMIN, json={"tokens_per_minute": 10})
    assert r.status_code == 409
    assert r.content == (
        b'{"error":{"message":"with --workers N and no Redis each worker holds its own limits, '
        b"so a live change would reach one worker only: set TOKENGATE_REDIS_URL, or edit "
        b'settings.json and send SIGHUP","type":"invalid_request_error","param":null,'
        b'"code":"not_shared"}}'
    )
    assert "x-should-retry" not in r.headers
