"""Property: any request body is a `ClientRequest` or an `InvalidRequest`, never a crash.

`parse_call` is the first code that touches a client's bytes. Random JSON (shaped like
the OpenAI requests it parses, and not), random bytes, and deep nesting must each end
in a `ClientRequest` whose cost and upstream body can be computed, or in an
`app.errors.InvalidRequest` (a clean 400): any other exception would be a 500.
"""

from __future__ import annotations

import time
from typing import Any, cast

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from app.errors import InvalidRequest
from app.pipeline.request import CHAT, COMPLETIONS, EMBEDDINGS, MESSAGES, ClientRequest, Endpoint
from app.pipeline.wire import parse_call
from app.runtime import KeySpec
from tests.unit.properties.strategies import json_values, request_like

KEY = KeySpec(alias="prop", digests=("0" * 64,), tokens_per_minute=1000, requests_per_minute=10)
ENDPOINTS = [CHAT, COMPLETIONS, EMBEDDINGS, MESSAGES]
bodies = st.one_of(
    request_like.map(orjson.dumps),
    json_values.map(orjson.dumps),
    st.binary(max_size=64),
)


def nested(depth: int, field: str, endpoint: Endpoint) -> bytes:
    body: dict[str, Any] = {"model": "gpt-4o", "max_tokens": 4, field: "NESTED"}
    if endpoint in (CHAT, MESSAGES) and field != "messages":
        body["messages"] = [{"role": "user", "content": "hi"}]
    return orjson.dumps(body).replace(b'"NESTED"', b"[" * depth + b"]" * depth)


def parse(endpoint: Endpoint, raw: bytes) -> ClientRequest | InvalidRequest:
    try:
        call = parse_call(endpoint, raw, KEY, "req_prop", {}, time.perf_counter())
    except InvalidRequest as err:
        assert err.status == 400 and cast(dict[str, Any], err.body())["error"]["message"]
        return err
    except RecursionError:  # (re-raised short: its traceback is a thousand frames)
        raise AssertionError(
            f"parse_call raised RecursionError on {endpoint.path} (the gateway answers 500)"
        ) from None
    assert isinstance(call, ClientRequest)
    # what the pipeline does next with it must not raise either
    assert call.cost(1024) >= 0
    for model in ("gpt-4o", call.model or "gpt-4o"):
        assert isinstance(call.body_for(model), bytes)
    return call


@settings(
    max_examples=300,
    deadline=None,
    database=None,
    derandomize=True,  # CI must not change verdict run to run; explore with a seed locally
    suppress_health_check=[HealthCheck.too_slow],
)
@given(st.sampled_from(ENDPOINTS), bodies)
@example(CHAT, b'{"model": "gpt-4o", "messages": [{"role": "user"}], "max_tokens": 1e12}')
@example(CHAT, b'{"model": "gpt-4o", "messages": [{"role": "user"}], "max_tokens": -5}')
@example(CHAT, b'{"messages": [{"role": "user"}], "stream": true, "stream_options": null}')
@example(MESSAGES, b'{"model": "m", "messages": [{"role": "user"}], "max_tokens": 1, "system": []}')
@example(COMPLETIONS, b'{"model": "m", "prompt": [1, [2, [3]]]}')
def test_any_body_is_a_call_or_a_clean_400(endpoint: Endpoint, raw: bytes) -> None:
    parse(endpoint, raw)


@settings(max_examples=100, deadline=None, database=None, derandomize=True)
@given(st.sampled_from(ENDPOINTS), request_like)
def test_fields_it_does_not_act_on_pass_through_untouched(
    endpoint: Endpoint, body: dict[str, Any]
) -> None:
    body = {**body, "x_vendor_extension": {"keep": [1, "two", None]}}
    outcome = parse(endpoint, orjson.dumps(body))
    if isinstance(outcome, ClientRequest):
        sent = orjson.loads(outcome.body_for(outcome.model or "gpt-4o"))
        assert sent["x_vendor_extension"] == {"keep": [1, "two", None]}


@pytest.mark.parametrize(
    ("endpoint", "field"),
    [
        (EMBEDDINGS, "input"),
        (COMPLETIONS, "prompt"),
        (CHAT, "tools"),
        (CHAT, "messages"),
        (MESSAGES, "system"),
    ],
    ids=[
        "embeddings-input",
        "completions-prompt",
        "chat-tools",
        "chat-messages",
        "messages-system",
    ],
)
def test_deep_nesting_the_json_parser_accepts_is_a_call_or_a_clean_400(
    endpoint: Endpoint, field: str
) -> None:
    """orjson reads up to 1024 levels; the estimates that walk the value must cope."""
    parse(endpoint, nested(1000, field, endpoint))
