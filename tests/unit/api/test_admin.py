"""`/admin/*`: off without an admin key, guarded with one, refusing what it cannot keep."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import httpx

from tests.support.inproc import ADMIN_KEY, MakeClient
from tests.support.waiting import eventually

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


async def test_usage_periods_out_of_range_or_malformed_are_400(client: httpx.AsyncClient) -> None:
    for query in ("to=1e400", "from=-1e400", "from=nan", "to=yesterday"):
        r = await client.get(f"/admin/usage?{query}", headers=ADMIN)
        assert r.status_code == 400, query
        assert r.json()["error"]["param"] == query.partition("=")[0]


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


async def test_deleting_live_limits_returns_the_key_to_the_files(make_client: MakeClient) -> None:
    client = await make_client({"admin_key": ADMIN_KEY, "keys": [ALICE]})
    put = await client.put("/admin/keys/alice/limits", headers=ADMIN, json={"tokens_per_minute": 9})
    assert put.status_code == 200
    status = (await client.get("/admin/status", headers=ADMIN)).json()
    (key,) = status["limits"]["keys"]
    assert key["live_override"] and key["limits"]["tokens_per_minute"] == 9
    r = await client.delete("/admin/keys/alice/limits", headers=ADMIN)
    assert r.status_code == 200
    assert r.json() == {
        "alias": "alice",
        "cleared": True,
        "requests_per_minute": 600,
        "tokens_per_minute": 120000,
        "max_concurrent": None,
    }
    status = (await client.get("/admin/status", headers=ADMIN)).json()
    (key,) = status["limits"]["keys"]
    assert not key["live_override"] and key["limits"]["tokens_per_minute"] == 120000
    again = await client.delete("/admin/keys/alice/limits", headers=ADMIN)
    assert again.status_code == 200 and again.json()["cleared"] is False
    unknown = await client.delete("/admin/keys/bob/limits", headers=ADMIN)
    assert unknown.status_code == 404
    assert (await client.delete("/admin/keys/alice/limits")).status_code == 401


async def test_deleting_live_limits_also_ends_a_live_max_concurrent(
    make_client: MakeClient,
) -> None:
    client = await make_client({"admin_key": ADMIN_KEY, "keys": [ALICE]})
    put = await client.put("/admin/keys/alice/limits", headers=ADMIN, json={"max_concurrent": 2})
    assert put.json()["max_concurrent"] == 2
    (key,) = (await client.get("/admin/status", headers=ADMIN)).json()["limits"]["keys"]
    assert key["max_concurrent"] == 2
    r = await client.delete("/admin/keys/alice/limits", headers=ADMIN)
    assert r.json()["cleared"] is True and r.json()["max_concurrent"] is None
    (key,) = (await client.get("/admin/status", headers=ADMIN)).json()["limits"]["keys"]
    assert key["max_concurrent"] is None


async def test_a_live_limit_set_on_one_worker_is_enforced_by_another_within_a_second(
    make_client: MakeClient, tmp_path: Path
) -> None:
    """No Redis, `--workers 2`: both workers read the live limit from the shared database
    (each enforces its half of it), where it used to reach one worker only."""
    shared = {"path": str(tmp_path / "shared.sqlite3")}
    settings = {"admin_key": ADMIN_KEY, "keys": [ALICE], "database": shared}
    one = await make_client(settings, workers=2)
    two = await make_client(settings, workers=2)
    r = await one.put("/admin/keys/alice/limits", headers=ADMIN, json={"requests_per_minute": 70})
    assert r.status_code == 200 and r.json()["requests_per_minute"] == 70

    async def alice_on_two() -> dict[str, Any]:
        status = (await two.get("/admin/status", headers=ADMIN)).json()
        (alice,) = [k for k in status["limits"]["keys"] if k["alias"] == "alice"]
        return dict(alice)

    async def overridden() -> bool:
        return bool((await alice_on_two())["live_override"])

    async def cleared() -> bool:
        return not await overridden()

    await eventually(overridden, "the other worker to read the live limit")
    assert (await alice_on_two())["limits"] == {
        "requests_per_minute": 35,
        "tokens_per_minute": 60000,
    }
    # cleared on one, it goes on the other too: the files' limits again
    assert (await one.delete("/admin/keys/alice/limits", headers=ADMIN)).json()["cleared"]
    await eventually(cleared, "the other worker to drop the cleared limit")
    assert (await alice_on_two())["limits"]["requests_per_minute"] == 300


async def test_admin_bodies_are_read_as_json_whatever_curl_sends_or_refused_415(
    make_client: MakeClient,
) -> None:
    """As the `/v1/` routes: no content type is JSON, `application/json` (with a charset)
    is JSON; a form (what `curl -d` sends without -H) or text is a clear 415."""
    client = await make_client({"admin_key": ADMIN_KEY, "keys": [ALICE]})
    body = b'{"requests_per_minute": 9}'
    url = "/admin/keys/alice/limits"
    for content_type in (None, "application/json", "application/json; charset=utf-8"):
        headers = dict(ADMIN) | ({"content-type": content_type} if content_type else {})
        r = await client.put(url, headers=headers, content=body)
        assert r.status_code == 200, (content_type, r.text)
        assert r.json()["requests_per_minute"] == 9
    for content_type in ("application/x-www-form-urlencoded", "text/plain", "application/xml"):
        r = await client.put(url, headers=ADMIN | {"content-type": content_type}, content=body)
        assert r.status_code == 415, content_type
        error = r.json()["error"]
        assert (
            error["code"] == "unsupported_media_type" and error["type"] == "invalid_request_error"
        )
        assert "Content-Type: application/json" in error["message"]
        assert content_type in error["message"]
    broken = await client.put(url, headers=ADMIN, content=b'{"requests_per_minute": ')
    assert broken.status_code == 400 and "not valid JSON" in broken.json()["error"]["message"]
    listed = await client.put(url, headers=ADMIN, content=b"[1]")
    assert listed.status_code == 400 and "JSON object" in listed.json()["error"]["message"]
    wrong = await client.put(url, headers=ADMIN, content=b'{"requests_per_minute": 0}')
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "requests_per_minute"
    extra = await client.put(url, headers=ADMIN, content=b'{"rpm": 5}')
    assert extra.status_code == 400 and extra.json()["error"]["param"] == "rpm"
    unauthenticated = await client.put(url, content=b"<xml/>", headers={"content-type": "text/xml"})
    assert unauthenticated.status_code == 401  # the key is checked before the body is read
