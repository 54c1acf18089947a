"""Issue 31, finding 6: every route that reaches an upstream goes through the key's
admission and is counted, not only the ones that generate: Anthropic's
`/v1/messages/count_tokens`, `/v1/responses/input_tokens` and the routes that follow a
stored response (retrieve, `input_items`, cancel, delete). Over real sockets: httpx ->
tokengate serve -> tokengate sim."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from tests.e2e.test_limits import counter
from tests.support.procs import Gateway, GatewaySpec, Sim

Make = Callable[..., Gateway]
ADMIN = "admin-side-routes-0123456789"
SIDE = ("/v1/messages/count_tokens", "/v1/responses/input_tokens")


def _side_calls(gw: Gateway, alias: str, response_id: str) -> list[httpx.Response]:
    h = {**gw.headers(alias), "anthropic-version": "2023-06-01"}
    ask = {"model": "claude-sonnet", "messages": [{"role": "user", "content": "count me"}]}
    base = f"{gw.url}/v1/responses"
    return [
        httpx.post(f"{gw.url}/v1/messages/count_tokens", headers=h, json=ask),
        httpx.post(f"{base}/input_tokens", headers=h, json={"model": "gpt-4o", "input": "x"}),
        httpx.get(f"{base}/{response_id}", headers=h),
        httpx.get(f"{base}/{response_id}/input_items", headers=h),
        httpx.post(f"{base}/{response_id}/cancel", headers=h),
        httpx.delete(f"{base}/{response_id}", headers=h),
    ]


def _usage(gw: Gateway, alias: str) -> dict[str, int]:
    r = httpx.get(f"{gw.url}/admin/usage", headers={"authorization": f"Bearer {ADMIN}"})
    rows = [row for row in r.json()["data"] if row["key"] == alias]
    return {
        "requests": sum(row["requests"] for row in rows),
        "tokens": sum(row["prompt_tokens"] + row["completion_tokens"] for row in rows),
    }


def _upstream_side_calls(sim: Sim) -> list[str]:
    return [
        r["path"]
        for r in sim.records()
        if r["path"] in SIDE or (r["path"].startswith("/v1/responses/resp_"))
    ]


def test_a_key_refused_on_chat_is_refused_on_every_route_that_reaches_an_upstream(
    make_sim: Callable[..., Sim], make_gateway: Make
) -> None:
    sim = make_sim("--background-ms", "60000")
    spec = GatewaySpec(
        toml={"scale_up": {"api_style": "both"}},
        keys={"tight": {"requests_per_minute": 2}},
        settings={"admin_key": ADMIN},
    )
    gw = make_gateway(spec, sim.url)
    with gw.openai("tight") as client:
        own = client.responses.create(model="gpt-4o", input="mine", background=True).id
        client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "x"}], max_tokens=2
        )
    refused = httpx.post(
        f"{gw.url}/v1/chat/completions",
        headers=gw.headers("tight"),
        json={"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]},
    )
    assert refused.status_code == 429
    sim.clear()
    for r in _side_calls(gw, "tight", own):
        assert r.status_code == 429, (r.request.method, r.request.url, r.text)
        error = r.json()["error"]  # Anthropic's shape on count_tokens, OpenAI's elsewhere
        assert error.get("code", "rate_limit_exceeded") == "rate_limit_exceeded"
        assert "Rate limit reached for requests" in error["message"]
        assert "retry-after" in r.headers
    assert _upstream_side_calls(sim) == []  # none of them reached the upstream
    limited = counter(gw.metrics(), "tokengate_rate_limited_total", key="tight", limit="requests")
    assert limited == 1 + 6
    refusals = [a for a in gw.access() if a.get("key") == "tight" and a["status"] == 429]
    assert len(refusals) == 1 + 6


def test_side_routes_are_charged_a_request_and_counted(
    make_sim: Callable[..., Sim], make_gateway: Make
) -> None:
    sim = make_sim("--background-ms", "60000")
    spec = GatewaySpec(
        toml={"scale_up": {"api_style": "both"}},
        keys={"k": {"requests_per_minute": 100}},
        settings={"admin_key": ADMIN},
    )
    gw = make_gateway(spec, sim.url)
    with gw.openai("k") as client:
        own = client.responses.create(model="gpt-4o", input="mine", background=True).id
    before = _usage(gw, "k")
    answers = _side_calls(gw, "k", own)
    assert [r.status_code for r in answers] == [200] * 6, [r.text for r in answers]
    # each answer says what is left: one request less each time
    left = [int(r.headers["x-ratelimit-remaining-requests"]) for r in answers]
    assert left == sorted(left, reverse=True) and left[0] > left[-1]
    after = _usage(gw, "k")
    assert after["requests"] == before["requests"] + 6  # the ledger has every one
    assert after["tokens"] == before["tokens"]  # and charged them no tokens
    lines = [a for a in gw.access() if a.get("key") == "k"]
    assert len(lines) == 1 + 6 and all(a["status"] == 200 for a in lines)
    assert counter(gw.metrics(), "tokengate_requests_total", status="200") >= 1 + 6
