"""Per-domain policy for comma-list headers (`anthropic-beta`), and the retry of a 400
that refuses a beta by name."""

from __future__ import annotations

import httpx
import orjson
import pytest
from pydantic import SecretStr, ValidationError

from app.config.cluster import HeaderPolicyConfig, ScaleUpConfig
from app.runtime import DomainSpec
from app.upstream.betas import MAX_REFUSED, HeaderPolicies, ValuePolicy, error_message
from app.upstream.client import UpstreamClient
from app.upstream.httpx_transport import HttpxTransport
from app.upstream.transport import Timeouts, UpstreamResponse

CLAUDE = "claude-code-20250219,interleaved-thinking-2025-05-14,context-1m-2026-03-01"
REFUSAL = (
    "Unexpected value(s) `context-1m-2026-03-01` for the `anthropic-beta` header. Please "
    "consult our documentation at docs.anthropic.com or try again without the header."
)


def policy(**cfg: object) -> ValuePolicy:
    return ValuePolicy.compile("anthropic-beta", HeaderPolicyConfig.model_validate(cfg))


def anthropic_error(message: str) -> bytes:
    return orjson.dumps(
        {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    )


# -- the policy, pure -------------------------------------------------------------------


def test_no_policy_passes_the_value_as_sent() -> None:
    assert ValuePolicy.compile("anthropic-beta", None).apply(CLAUDE) == CLAUDE
    assert policy().passes


def test_drop_removes_listed_values_and_globs() -> None:
    p = policy(drop=["context-1m-*", "claude-code-20250219"])
    assert p.apply(CLAUDE) == "interleaved-thinking-2025-05-14"


def test_allow_keeps_only_matching_values_so_new_dated_betas_follow_the_rule() -> None:
    p = policy(allow=["*-2025-*", "claude-code-*"])
    assert p.apply(CLAUDE) == "claude-code-20250219,interleaved-thinking-2025-05-14"
    # a beta released next month matches a year rule without a config change
    assert policy(allow=["*-2026-*"]).apply("effort-2026-11-24") == "effort-2026-11-24"


def test_an_empty_allow_list_sends_no_header() -> None:
    assert policy(allow=[]).apply(CLAUDE) is None


def test_rename_then_allow_sees_the_new_name() -> None:
    p = policy(rename={"context-1m-2026-03-01": "long-context-2025-01-01"}, allow=["*-2025-*"])
    assert p.apply(CLAUDE) == "interleaved-thinking-2025-05-14,long-context-2025-01-01"


def test_globs_match_whole_values_and_case() -> None:
    p = policy(drop=["context-1m"])
    assert p.apply("context-1m-2026-03-01") == "context-1m-2026-03-01"
    assert policy(allow=["Claude-*"]).apply("claude-code-20250219") is None


def test_spaces_and_duplicates_are_normalised_only_when_a_policy_applies() -> None:
    assert policy().apply(" a , a ,b") == " a , a ,b"
    assert policy(drop=["x"]).apply(" a , a ,b") == "a,b"


def test_refusal_names_only_values_that_were_sent_as_whole_tokens() -> None:
    p = policy()
    assert p.refusal(CLAUDE, anthropic_error(REFUSAL)) == ["context-1m-2026-03-01"]
    # a value that is only a prefix of the named one is not refused
    assert p.refusal("context-1m", anthropic_error(REFUSAL)) == []
    # an error about something else that happens to contain a value's text
    other = anthropic_error("max_tokens: claude-code-20250219 is too large")
    assert p.refusal(CLAUDE, other) == []
    # Bedrock's bare message names nothing: not retried
    assert p.refusal(CLAUDE, orjson.dumps({"message": "invalid beta flag"})) == []
    assert policy(retry_refused=False).refusal(CLAUDE, anthropic_error(REFUSAL)) == []


def test_error_message_reads_both_shapes_and_tolerates_garbage() -> None:
    assert error_message(b'{"error": {"message": "m"}}') == "m"
    assert error_message(b'{"message": "bare"}') == "bare"
    for junk in (b"", b"<html>", b"[1]", b'{"error": "x"}', b'{"message": 3}'):
        assert error_message(junk) == ""
    assert len(error_message(orjson.dumps({"message": "x" * 100_000}))) == 4096


def test_refused_values_are_remembered_up_to_a_bound() -> None:
    p = policy()
    p.remember([f"beta-{i}" for i in range(MAX_REFUSED + 10)])
    assert len(p.refused) == MAX_REFUSED
    assert p.apply("beta-1,other") == "other"


def test_policies_rewrite_outgoing_headers_in_place_and_drop_an_emptied_header() -> None:
    cfg = {"anthropic-beta": HeaderPolicyConfig(allow=["keep-*"])}
    headers = {"anthropic-beta": "keep-1,gone", "x-api-key": "sk"}
    HeaderPolicies(cfg).outgoing(headers)
    assert headers == {"anthropic-beta": "keep-1", "x-api-key": "sk"}
    headers = {"anthropic-beta": "gone"}
    HeaderPolicies(cfg).outgoing(headers)
    assert headers == {}


def test_only_the_comma_list_api_headers_take_a_policy() -> None:
    ScaleUpConfig.model_validate({"domain": "d", "headers": {"openai-beta": {"drop": ["x"]}}})
    with pytest.raises(ValidationError):
        ScaleUpConfig.model_validate({"domain": "d", "headers": {"authorization": {}}})
    with pytest.raises(ValidationError):
        ScaleUpConfig.model_validate(
            {"domain": "d", "headers": {"anthropic-beta": {"mode": "strip"}}}
        )


# -- the client: one retry without the refused value --------------------------------------


def spec(**headers: HeaderPolicyConfig) -> DomainSpec:
    return DomainSpec("strict", "http://up", SecretStr("sk"), "K", None, 4, headers=headers)


class Strict:
    """An upstream that refuses every beta outside `known`, as Vertex does."""

    def __init__(self, known: set[str], message: str = REFUSAL) -> None:
        self.known, self.message = known, message
        self.seen: list[str | None] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        sent = request.headers.get("anthropic-beta")
        self.seen.append(sent)
        unknown = [v for v in (sent or "").split(",") if v and v not in self.known]
        if unknown:
            return httpx.Response(400, content=anthropic_error(self.message))
        return httpx.Response(200, json={"ok": True})


def client(
    upstream: Strict, refused: list[tuple[str, str]], **headers: HeaderPolicyConfig
) -> UpstreamClient:
    transport = HttpxTransport(Timeouts(1, 1), 2, 2, httpx.MockTransport(upstream))
    return UpstreamClient(spec(**headers), transport, lambda d, h: refused.append((d, h)))


async def send(c: UpstreamClient, *, stream: bool = False) -> UpstreamResponse:
    """One Messages request from Claude Code: its `anthropic-beta` list, an empty body."""
    return await c.send(
        "/v1/messages",
        b"{}",
        stream=stream,
        request_id="r",
        client_headers={"anthropic-beta": CLAUDE},
    )


async def test_a_refused_beta_is_sent_again_once_without_it_counted_and_remembered() -> None:
    upstream = Strict({"claude-code-20250219", "interleaved-thinking-2025-05-14"})
    refused: list[tuple[str, str]] = []
    c = client(upstream, refused)
    resp = await send(c)
    assert resp.status == 200
    assert upstream.seen == [CLAUDE, "claude-code-20250219,interleaved-thinking-2025-05-14"]
    assert refused == [("strict", "anthropic-beta")]
    # the next request drops it up front: one upstream call, nothing counted
    resp = await send(c)
    assert resp.status == 200 and len(upstream.seen) == 3 and len(refused) == 1
    await c.close()


async def test_a_400_that_names_no_sent_value_is_relayed_once_with_its_body() -> None:
    upstream = Strict(set(), message="invalid beta flag")
    refused: list[tuple[str, str]] = []
    c = client(upstream, refused)
    resp = await send(c, stream=True)
    assert resp.status == 400 and len(upstream.seen) == 1 and refused == []
    assert b"invalid beta flag" in await resp.read()
    await c.close()


async def test_retry_refused_false_relays_the_400() -> None:
    upstream = Strict(set())
    refused: list[tuple[str, str]] = []
    c = client(upstream, refused, **{"anthropic-beta": HeaderPolicyConfig(retry_refused=False)})
    resp = await send(c)
    assert resp.status == 400 and len(upstream.seen) == 1 and refused == []
    await c.close()


async def test_the_retry_happens_once_even_if_the_upstream_refuses_again() -> None:
    # an upstream naming the beta each time but also refusing the request without it
    class Stubborn(Strict):
        def __call__(self, request: httpx.Request) -> httpx.Response:
            self.seen.append(request.headers.get("anthropic-beta"))
            return httpx.Response(400, content=anthropic_error(REFUSAL))

    upstream = Stubborn(set())
    c = client(upstream, [])
    resp = await send(c)
    assert resp.status == 400 and len(upstream.seen) == 2
    await c.close()


async def test_a_configured_allow_list_is_applied_before_the_first_send() -> None:
    upstream = Strict({"claude-code-20250219"})
    c = client(upstream, [], **{"anthropic-beta": HeaderPolicyConfig(allow=["claude-code-*"])})
    resp = await send(c)
    assert resp.status == 200 and upstream.seen == ["claude-code-20250219"]
    await c.close()


def test_a_reload_with_a_new_policy_forgets_learned_refusals_an_unchanged_one_keeps_them() -> None:
    c = UpstreamClient(
        spec(), HttpxTransport(Timeouts(1, 1), 2, 2, httpx.MockTransport(Strict(set())))
    )
    c.policies.learn({"anthropic-beta": ["old"]})
    c.rekey(spec())
    assert c.policies.policies["anthropic-beta"].refused == {"old"}
    c.rekey(spec(**{"anthropic-beta": HeaderPolicyConfig(drop=["x"])}))
    assert c.policies.policies["anthropic-beta"].refused == set()
