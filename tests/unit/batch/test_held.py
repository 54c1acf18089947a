"""Deferred background responses (`app/batch/held.py`): which requests are held, the
Response a client sees while held, and what the runner writes when one has run."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.batch import held
from app.kinds import BatchStatus, ItemState, ServiceTier
from app.pipeline.request import CHAT, RESPONSES, RESPONSES_COMPACT
from app.pipeline.responses_api import ResponsesService
from app.pipeline.wire import parse_call
from app.runtime import KeySpec


def key(defer: str = "none") -> KeySpec:
    return KeySpec("k", ("f" * 64,), 10, 10, defer_requests=defer)


def call(defer: str = "none", endpoint: Any = RESPONSES, **body: Any) -> Any:
    raw = json.dumps(
        {"model": "m", **({"input": "hi"} if endpoint is RESPONSES else {}), **body}
    ).encode()
    return parse_call(endpoint, raw, key(defer), "req", {}, 0.0)


@pytest.mark.parametrize(
    ("defer", "body", "wanted"),
    [
        ("background", {"background": True}, True),
        ("all", {"background": True}, True),
        ("none", {"background": True}, False),
        ("none", {"background": True, "metadata": {"tokengate_defer": "true"}}, True),
        ("none", {"background": True, "metadata": {"tokengate_defer": "no"}}, False),
        ("background", {}, False),  # not background: the client waits for the answer
        ("background", {"background": True, "stream": True}, False),  # a stream is read now
        ("background", {"background": True, "store": False}, False),  # nowhere to keep it
    ],
)
def test_which_requests_are_held(defer: str, body: dict[str, Any], wanted: bool) -> None:
    service = held.HeldResponses.__new__(held.HeldResponses)
    assert service.wants(call(defer, **body)) is wanted


def test_ids_are_the_gateways_own_and_the_responses_service_knows_them() -> None:
    assert ResponsesService.held_prefix == held.PREFIX
    assert held.owns("resp_tgd0123") and not held.owns("resp_0123abcd")
    assert not any(c in "0123456789abcdef" for c in held.PREFIX[len("resp_") :][:1])


def test_a_held_response_looks_like_openais_queued_background_response() -> None:
    body = {"input": "x", "metadata": {"tokengate_defer": "true", "job": "7"}, "top_p": 0.5}
    response = held.queued("resp_tgd1", 100, body, "gpt-4o")
    assert response["status"] == "queued" and response["background"] is True
    assert response["object"] == "response" and response["output"] == []
    assert response["usage"] is None and response["error"] is None
    assert response["metadata"] == {"job": "7"}  # the gateway's own word is not echoed
    assert (response["model"], response["top_p"], response["created_at"]) == ("gpt-4o", 0.5, 100)


def row(status: str = BatchStatus.IN_PROGRESS, response_status: str = "in_progress") -> Any:
    response = {"id": "resp_tgd1", "status": response_status, "tokengate_deferral": {"w": 1}}
    return {"id": "resp_tgd1", "status": status, "response": response}


def test_a_run_response_takes_the_upstreams_answer_under_the_gateways_id() -> None:
    r = row()
    answer = {"id": "resp_abc", "status": "completed", "output": [{"type": "message"}]}
    result = {"response": {"status_code": 200, "body": answer, "domain": "gpu-b"}}
    held.settled(r, ItemState.DONE, result)
    assert r["domain"] == "gpu-b"  # where the upstream keeps it: a later turn goes there
    assert r["response"]["id"] == "resp_tgd1" and r["response"]["status"] == "completed"
    assert r["response"]["output"] == [{"type": "message"}] and r["response"]["background"]
    assert r["response"]["tokengate_deferral"] == {"w": 1} and r["upstream_id"] == "resp_abc"


def test_a_failed_or_expired_response_says_why_and_a_cancelled_one_stays_cancelled() -> None:
    r = row()
    error = {"code": "upstream_rejected", "message": "the upstream answered 400"}
    held.settled(r, ItemState.FAILED, {"error": error, "response": None})
    assert r["response"]["status"] == "failed"
    assert r["response"]["error"] == error
    expired = row()
    held.settled(expired, None, None)
    assert expired["response"]["error"]["code"] == "expired"
    cancelled = row(BatchStatus.CANCELLED, "cancelled")
    held.settled(cancelled, ItemState.DONE, {"response": {"body": {"id": "x"}}})
    assert cancelled["response"]["status"] == "cancelled" and "upstream_id" not in cancelled


def test_only_responses_are_held() -> None:
    chat = call("all", CHAT, background=True, messages=[{"role": "user", "content": "x"}])
    service = held.HeldResponses.__new__(held.HeldResponses)
    assert service.wants(chat) is False
    compact = call("all", RESPONSES_COMPACT, background=True)
    assert service.wants(compact) is False


def test_a_key_deferring_all_serves_its_other_requests_as_flex(
    make_local_gateway: Any,
) -> None:
    keys = [
        {"alias": "all", "key_sha256": "a" * 64, "defer_requests": "all"},
        {"alias": "bg", "key_sha256": "b" * 64, "defer_requests": "background"},
        {
            "alias": "forced",
            "key_sha256": "c" * 64,
            "defer_requests": "all",
            "service_tier": "priority",
        },
    ]
    gw = make_local_gateway({"keys": keys})
    tiers = {k.alias: (k.defer_requests, k.service_tier) for k in gw.runtime.keys}
    assert tiers == {
        "all": ("all", ServiceTier.FLEX),
        "bg": ("background", None),
        "forced": ("all", ServiceTier.PRIORITY),  # a tier the operator forced wins
    }
