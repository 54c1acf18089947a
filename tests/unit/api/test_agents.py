"""What coding agents need of the HTTP API, in-process: count_tokens (forwarded or
estimated, never charged), Anthropic's model list, pattern aliases, and the output
reservation that lets a modest key serve Claude Code's max_tokens."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json

import httpx

from tests.support.clock import FakeClock
from tests.support.inproc import ADMIN_KEY, MakeClient, gateway_of

ALICE = {"alias": "alice", "key_sha256": hashlib.sha256(b"tg-alice-key").hexdigest()}

ANTHROPIC = {"anthropic-version": "2023-06-01", "x-api-key": "any"}
ASK = {"model": "claude-x", "messages": [{"role": "user", "content": "hello there " * 40}]}


def domain(style: str, models: list[str]) -> dict[str, object]:
    return {"scale_up": {"api_style": style, "models": models}}


def counting(seen: list[httpx.Request], status: int = 200) -> object:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path.endswith("/v1/messages/count_tokens"):
            return httpx.Response(status, json={"input_tokens": 77})
        return httpx.Response(200, json={"object": "list", "data": []})

    return handler


async def test_count_tokens_goes_to_an_anthropic_domain_with_its_key(
    make_client: MakeClient,
) -> None:
    seen: list[httpx.Request] = []
    client = await make_client(domain("both", ["claude-x"]), handler=counting(seen))
    headers = {**ANTHROPIC, "anthropic-beta": "token-counting-2024-11-01"}
    r = await client.post("/v1/messages/count_tokens?beta=true", json=ASK, headers=headers)
    assert r.status_code == 200 and r.json() == {"input_tokens": 77}
    assert "x-tokengate-estimated" not in r.headers and r.headers["x-tokengate-domain"]
    (sent,) = [s for s in seen if s.url.path.endswith("/count_tokens")]
    assert sent.headers["x-api-key"] == "sk-upstream" and "authorization" not in sent.headers
    assert sent.headers["anthropic-beta"] == "token-counting-2024-11-01"
    gw = gateway_of(client)
    # charged a request, no tokens (issue 31: every route that reaches an upstream)
    limit = int(r.headers["x-ratelimit-limit-requests"])
    assert r.headers["x-ratelimit-remaining-requests"] == str(limit - 1)
    (buckets,) = gw.admission.store.buckets._keys.values()  # type: ignore[attr-defined]
    assert buckets.tokens.level == buckets.tokens.capacity  # the reservation went back
    assert 'tokengate_requests_total{domain="default",model="claude-x",status="200"} 1.0' in (
        gw.render_metrics().decode()
    )


async def test_count_tokens_is_estimated_when_no_anthropic_domain_can_answer(
    make_client: MakeClient,
) -> None:
    seen: list[httpx.Request] = []
    client = await make_client(domain("openai", ["claude-x"]), handler=counting(seen))
    r = await client.post("/v1/messages/count_tokens", json=ASK, headers=ANTHROPIC)
    assert r.status_code == 200 and r.headers["x-tokengate-estimated"] == "true"
    assert r.json()["input_tokens"] > 100  # 480 characters / 4, and framing
    assert not [s for s in seen if "count_tokens" in s.url.path]
    missing = await client.post(
        "/v1/messages/count_tokens", json={**ASK, "model": "nope"}, headers=ANTHROPIC
    )
    assert missing.status_code == 404 and missing.json()["type"] == "error"


async def test_an_upstream_without_count_tokens_gets_the_estimate(
    make_client: MakeClient,
) -> None:
    seen: list[httpx.Request] = []
    client = await make_client(domain("anthropic", ["claude-x"]), handler=counting(seen, 404))
    r = await client.post("/v1/messages/count_tokens", json=ASK, headers=ANTHROPIC)
    assert r.status_code == 200 and r.headers["x-tokengate-estimated"] == "true"


async def test_models_in_anthropics_shape_when_asked_in_its_dialect(
    make_client: MakeClient,
) -> None:
    settings = {
        **domain("both", ["claude-a", "claude-b", "claude-c"]),
        "model_aliases": {"claude-*": "claude-a", "sonnet": "claude-b"},
    }
    client = await make_client(settings)
    r = await client.get("/v1/models?limit=2", headers=ANTHROPIC)
    body = r.json()
    assert [m["id"] for m in body["data"]] == ["claude-a", "claude-b"] and body["has_more"]
    assert body["data"][0]["type"] == "model" and body["data"][0]["display_name"] == "claude-a"
    assert (body["first_id"], body["last_id"]) == ("claude-a", "claude-b")
    page2 = (await client.get("/v1/models?after_id=claude-b", headers=ANTHROPIC)).json()
    assert [m["id"] for m in page2["data"]] == ["claude-c", "sonnet"] and not page2["has_more"]
    openai = (await client.get("/v1/models")).json()
    assert openai["object"] == "list" and "claude-*" not in {m["id"] for m in openai["data"]}
    one = await client.get("/v1/models/claude-c", headers=ANTHROPIC)
    assert one.json()["type"] == "model"
    assert (await client.get("/v1/models/claude-zzz")).status_code == 404


async def test_a_pattern_alias_catches_unlisted_names_only(make_client: MakeClient) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        body = {
            "model": json.loads(request.content)["model"],
            "content": [],
            "usage": {"input_tokens": 3, "output_tokens": 1},
        }
        return httpx.Response(200, json=body)

    settings = {
        **domain("both", ["claude-a", "claude-b"]),
        "model_aliases": {"claude-*": "claude-a"},
    }
    client = await make_client(settings, handler=handler)
    for asked in ("claude-opus-9", "claude-b"):
        r = await client.post(
            "/v1/messages", json={**ASK, "model": asked, "max_tokens": 5}, headers=ANTHROPIC
        )
        assert r.status_code == 200
    assert [json.loads(s.content)["model"] for s in seen] == ["claude-a", "claude-b"]
    r = await client.post(
        "/v1/messages", json={**ASK, "model": "gpt-9", "max_tokens": 5}, headers=ANTHROPIC
    )
    assert r.status_code == 404


async def test_agent_max_tokens_reserve_an_estimate_not_the_ceiling(
    make_client: MakeClient, clock: FakeClock
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = {
            "model": "claude-x",
            "content": [],
            "usage": {"input_tokens": 50, "output_tokens": 300},
        }
        return httpx.Response(200, json=body)

    limits = {"tokens_per_minute": 60_000, "default_max_tokens": 2000}
    # the buckets' clock stands still: no refill between requests, however slow they are
    estimate = await make_client(
        {**domain("both", ["claude-x"]), "rate_limit": limits}, handler=handler, clock=clock
    )
    strict = await make_client(
        {**domain("both", ["claude-x"]), "rate_limit": {**limits, "reserve_output": "max_tokens"}},
        handler=handler,
    )
    agent = {**ASK, "max_tokens": 128_000}
    refused = await strict.post("/v1/messages", json=agent, headers=ANTHROPIC)
    assert refused.status_code == 429 and "whole allowance" in refused.json()["error"]["message"]
    remaining = []
    for _ in range(8):
        r = await estimate.post("/v1/messages", json=agent, headers=ANTHROPIC)
        assert r.status_code == 200
        remaining.append(int(r.headers["x-ratelimit-remaining-tokens"]))
    # each answer costs 350 (50 + 300): while the first five reserve the default (2000),
    # what remains drops by that; from the sixth on, 300 is reserved, not 2000
    steps = [b - a for a, b in itertools.pairwise(remaining)]
    assert steps[:4] == [-350] * 4
    assert steps[4] == 2000 - 300 - 350 and steps[5:] == [-350] * 2


async def test_a_keys_max_concurrent_queues_its_extra_requests(make_client: MakeClient) -> None:
    inflight, peak = 0, 0

    async def slow(request: httpx.Request) -> httpx.Response:
        nonlocal inflight, peak
        inflight += 1
        peak = max(peak, inflight)
        await asyncio.sleep(0.05)
        inflight -= 1
        body = {
            "model": "m-1",
            "choices": [],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1},
        }
        return httpx.Response(200, json=body)

    settings = {"scale_up": {"models": ["m-1"]}, "rate_limit": {"max_concurrent": 2}}
    client = await make_client(settings, handler=slow)
    chat = {"model": "m-1", "messages": [{"role": "user", "content": "x"}]}
    answers = await asyncio.gather(
        *(client.post("/v1/chat/completions", json=chat) for _ in range(6))
    )
    assert [r.status_code for r in answers] == [200] * 6 and peak == 2
    metrics = gateway_of(client).render_metrics().decode()
    assert 'tokengate_key_concurrency_waits_total{key="anonymous",outcome="granted"} 4.0' in metrics

    async def slower(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.4)  # the third request's wait: far past its 100 ms
        return await slow(request)

    # 100 ms, not less: the two that get a slot at once must not miss it on a loaded
    # machine (a 20 ms wait against a 50 ms upstream did, once, under `-n 2` and a build)
    hurried = await make_client(
        {**settings, "token_scheduler": {"max_queue_wait_ms": 100}},
        handler=slower,
    )
    answers = await asyncio.gather(
        *(hurried.post("/v1/chat/completions", json=chat) for _ in range(3))
    )
    late = [r for r in answers if r.status_code != 200]
    assert len(late) == 1 and late[0].status_code == 503
    assert late[0].json()["error"]["code"] == "queue_timeout" and late[0].headers["retry-after"]


async def test_max_concurrent_is_set_live_and_shown(make_client: MakeClient) -> None:
    client = await make_client({"admin_key": ADMIN_KEY, "keys": [ALICE]})
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    r = await client.put("/admin/keys/alice/limits", headers=admin, json={"max_concurrent": 3})
    assert r.status_code == 200 and r.json()["max_concurrent"] == 3
    (key,) = (await client.get("/admin/status", headers=admin)).json()["limits"]["keys"]
    assert (key["max_concurrent"], key["reserve_output"]) == (3, "estimate")
    bad = await client.put("/admin/keys/alice/limits", headers=admin, json={"max_concurrent": 0})
    assert bad.status_code == 400
