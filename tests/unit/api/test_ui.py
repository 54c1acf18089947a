"""The status page's routes and its snapshot, in-process (the browser test is e2e)."""

from __future__ import annotations

import httpx

from tests.support.inproc import ADMIN_KEY, CHAT_OK, MakeClient

ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
CHAT = {"model": "m-1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


def upstream(request: httpx.Request) -> httpx.Response:
    if request.url.path.endswith("/models"):
        return httpx.Response(200, json={"object": "list", "data": [{"id": "m-1"}]})
    return httpx.Response(200, json=CHAT_OK)


def failing(request: httpx.Request) -> httpx.Response:
    return httpx.Response(500, json={"error": {"message": "sk-secret-upstream-detail boom"}})


async def test_the_page_and_its_assets_are_served_with_strict_headers(
    client: httpx.AsyncClient,
) -> None:
    page = await client.get("/ui")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert "unsafe-inline" not in csp
    assert page.headers["x-frame-options"] == "DENY"
    assert page.headers["x-content-type-options"] == "nosniff"
    assert page.headers["referrer-policy"] == "no-referrer"
    # Nothing from elsewhere, no inline script: the page works air-gapped under its CSP.
    assert "http://" not in page.text.replace("http://www.w3.org", "")
    assert "https://" not in page.text and "<script>" not in page.text
    for asset, ctype in (
        ("app.js", "javascript"),
        ("app.css", "text/css"),
        ("icon.svg", "image/svg+xml"),
    ):
        r = await client.get(f"/ui/assets/{asset}")
        assert r.status_code == 200 and ctype in r.headers["content-type"], asset
        assert r.headers["cache-control"] == "no-cache" and r.headers["etag"]
        assert r.headers["content-security-policy"] == csp
        again = await client.get(
            f"/ui/assets/{asset}", headers={"if-none-match": r.headers["etag"]}
        )
        assert again.status_code == 304


async def test_the_root_redirects_to_the_page_and_assets_do_not_escape(
    client: httpx.AsyncClient,
) -> None:
    root = await client.get("/")
    assert root.status_code == 307 and root.headers["location"] == "/ui"
    for path in (
        "/ui/assets/../../config/schema.py",
        "/ui/assets/%2e%2e/api/ui.py",
        "/ui/assets/nope.js",
    ):
        assert (await client.get(path)).status_code == 404, path


async def test_the_snapshot_needs_the_admin_key(make_client: MakeClient) -> None:
    client = await make_client({"admin_key": ADMIN_KEY})
    assert (await client.get("/admin/ui/snapshot")).status_code == 401
    wrong = await client.get("/admin/ui/snapshot", headers={"authorization": "Bearer nope"})
    assert wrong.status_code == 401
    without = await make_client()
    r = await without.get("/admin/ui/snapshot", headers=ADMIN)
    assert r.status_code == 404 and "TOKENGATE_ADMIN_KEY" in r.json()["error"]["message"]


async def test_the_snapshot_shows_traffic_keys_and_this_replica(make_client: MakeClient) -> None:
    # Slow refills (3 requests back in 30 s, 12 tokens in 6 s): the use still shows when a
    # loaded machine is slow between the requests and the snapshot.
    slow = {"requests_per_minute": 6, "tokens_per_minute": 120}
    client = await make_client({"admin_key": ADMIN_KEY, "rate_limit": slow}, handler=upstream)
    before = (await client.get("/admin/ui/snapshot", headers=ADMIN)).json()
    for _ in range(3):
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
    r = await client.get("/admin/ui/snapshot", headers=ADMIN)
    assert r.status_code == 200 and r.headers["cache-control"] == "no-store"
    snap = r.json()

    assert snap["replica"]["workers"] == 1 and ":" in snap["replica"]["id"]
    assert snap["replicas"] == [{"id": snap["replica"]["id"], "last_seen_sec": 0.0, "self": True}]
    assert snap["ready"] is True and snap["attention"] == []
    domain = snap["status"]["domains"]["default"]
    assert domain["queue_capacity"] == 1024 and domain["max_inflight"] >= 1
    assert set(domain["queue_by_priority"]) == {"high", "normal", "low", "batch"}

    totals, was = snap["series"]["totals"], before["series"]["totals"]
    assert totals["requests"]["2xx"] == was["requests"]["2xx"] + 3
    assert totals["tokens"] == {"prompt": 9, "completion": 3}
    assert len(snap["series"]["requests_per_sec"]["2xx"]) == 180  # 15 min at 5 s
    assert snap["series"]["totals"]["queue_wait_ms"]["p95"] is not None

    (key,) = snap["keys"]  # --no-auth: the anonymous key serves everything
    assert key["alias"] == "anonymous" and key["source"] == "live"
    assert key["requests"] == {"limit": 6, "remaining": 3}
    assert key["tokens"]["remaining"] < key["tokens"]["limit"]
    assert key["budget"] is None
    assert snap["errors"] == {"total": 0, "recent": []}


async def test_errors_are_listed_without_upstream_detail_and_flagged(
    make_client: MakeClient,
) -> None:
    client = await make_client(
        {"admin_key": ADMIN_KEY, "retry_policy": {"max_attempts": 1}}, handler=failing
    )
    for _ in range(6):
        r = await client.post("/v1/chat/completions", json=CHAT, headers={"x-request-id": "req-t1"})
        assert r.status_code >= 500
    snap = (await client.get("/admin/ui/snapshot", headers=ADMIN)).json()
    errors = snap["errors"]
    assert errors["total"] == 6
    first = errors["recent"][0]
    assert (first["request_id"], first["key"], first["model"]) == ("req-t1", "anonymous", "m-1")
    assert first["status"] >= 500 and first["code"]
    assert "sk-secret" not in str(snap)  # the page never shows an upstream body
    assert snap["series"]["totals"]["requests"]["5xx"] == 6
    levels = {(a["level"], a["text"].split(":")[0]) for a in snap["attention"]}
    assert ("critical", "domain default") in levels  # the circuit opened
    assert any("5xx" in a["text"] for a in snap["attention"] if a["level"] == "critical")
    assert snap["attention"][0]["level"] == "critical"  # worst first


async def test_refusals_before_admission_are_errors_too(make_client: MakeClient) -> None:
    client = await make_client({"admin_key": ADMIN_KEY}, handler=upstream)
    unnamed = {k: v for k, v in CHAT.items() if k != "model"}  # and no default route
    r = await client.post("/v1/chat/completions", json=unnamed)
    assert r.status_code == 400
    snap = (await client.get("/admin/ui/snapshot", headers=ADMIN)).json()
    (entry,) = snap["errors"]["recent"]
    assert entry["status"] == 400 and entry["code"] == "missing_model"
    assert entry["message"].startswith("you must provide a model parameter")
    assert snap["series"]["totals"]["requests"]["4xx"] == 1


async def test_disabled_the_page_and_its_data_do_not_exist(make_client: MakeClient) -> None:
    client = await make_client({"admin_key": ADMIN_KEY, "ui": {"enabled": False}})
    for path in ("/", "/ui", "/ui/assets/app.js"):
        assert (await client.get(path)).status_code == 404, path
    assert (await client.get("/admin/ui/snapshot", headers=ADMIN)).status_code == 404
    assert (await client.get("/admin/status", headers=ADMIN)).status_code == 200
