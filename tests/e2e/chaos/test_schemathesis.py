"""Schema-driven fuzzing of a running gateway (schemathesis + hypothesis).

`GET /openapi.json` of a real `tokengate serve` is loaded; every operation gets a bounded
number of generated requests, valid (positive) and invalid (negative), sent over
loopback with working credentials (the admin key on `/admin/*`, a gateway key
elsewhere), and each answer must pass `not_a_server_error`: no 5xx, ever, for anything
the schema lets a client send. The proxy routes read a raw `Request`, so their schema has
no body model: a second test sends random JSON bodies (shaped like OpenAI requests, and
not) to them directly, and a third random frames to the Responses WebSocket mode over one
real connection (not in the schema either).

Needs the `schemathesis` package (dev extra).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest
import schemathesis
import websockets.sync.client as ws_client
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok

from tests.e2e.chaos._support import ADMIN, ADMIN_H, Make
from tests.support.procs import Gateway, GatewaySpec, Sim
from tests.unit.properties.strategies import request_like

EXAMPLES_PER_OPERATION = 25
FUZZ = settings(
    max_examples=EXAMPLES_PER_OPERATION,
    deadline=None,
    database=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)


def fuzz_gateway(make_gateway: Make, sim: Sim) -> Gateway:
    return make_gateway(
        GatewaySpec(
            settings={
                "admin_key": ADMIN,
                "model_route": {"fallback": None},
                "retry_policy": {"max_attempts": 1},
            },
            keys={"alice": {"requests_per_minute": 1_000_000, "tokens_per_minute": 10**10}},
        ),
        sim.url,
    )


def fuzz_one(
    gw: Gateway,
    operation: Any,
    mode: schemathesis.GenerationMode,
    headers: dict[str, str],
    label: str,
    tried: dict[str, int],
) -> Callable[[], None]:
    @FUZZ
    @given(case=operation.as_strategy(generation_mode=mode))
    def check(case: Any) -> None:
        tried[label] += 1
        response = case.call(base_url=gw.url, headers=headers, timeout=30)
        case.validate_response(response, checks=[not_a_server_error])

    return check


@pytest.mark.slow
def test_every_operation_of_the_openapi_schema_never_answers_5xx(
    sim: Sim, make_gateway: Make
) -> None:
    gw = fuzz_gateway(make_gateway, sim)
    schema = schemathesis.openapi.from_url(f"{gw.url}/openapi.json")
    failures: dict[str, str] = {}
    tried: dict[str, int] = {}
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result
        operation = result.ok()
        headers = ADMIN_H if operation.path.startswith("/admin") else gw.headers()
        for mode in schemathesis.GenerationMode:
            label = f"{operation.label} [{mode.value}]"
            tried[label] = 0
            try:
                fuzz_one(gw, operation, mode, headers, label, tried)()
            except Unsatisfiable:  # nothing invalid to send (an operation without inputs)
                assert mode is schemathesis.GenerationMode.NEGATIVE, label
                del tried[label]
            except Exception as exc:  # one operation's failure must not hide the others
                failures[label] = f"{type(exc).__name__}: {str(exc)[:600]}"
    assert len(tried) >= 2 * 10, sorted(tried)  # every route of the gateway was reached
    assert sum(tried.values()) >= len(tried) * 5, tried
    assert failures == {}
    assert httpx.get(f"{gw.url}/health").status_code == 200


PROXY_PATHS = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/responses",
    "/v1/responses/compact",
    "/v1/responses/input_tokens",
]


def test_random_json_bodies_on_the_proxy_routes_never_answer_5xx(
    make_sim: Callable[..., Sim], make_gateway: Make
) -> None:
    sim = make_sim("--models", "gpt-4o,claude-sonnet,text-embedding-3-small,m")
    gw = fuzz_gateway(make_gateway, sim)
    bad: list[tuple[str, int, str, str]] = []
    client = httpx.Client(timeout=30, headers={**gw.headers(), "content-type": "application/json"})

    @settings(
        max_examples=120,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.sampled_from(PROXY_PATHS), request_like)
    def check(path: str, body: dict[str, Any]) -> None:
        raw = orjson.dumps(body)
        r = client.post(f"{gw.url}{path}", content=raw)
        # 502/504 would be the upstream's fault, and the sim here is healthy
        if r.status_code >= 500:
            bad.append((path, r.status_code, raw.decode()[:300], r.text[:300]))

    started = time.monotonic()
    with client:
        check()
    assert bad == [], bad[:5]
    assert time.monotonic() - started < 60
    assert httpx.get(f"{gw.url}/health").status_code == 200


# -- the Responses WebSocket mode: not in the OpenAPI schema, fuzzed over a real socket ------
socket_frames = st.one_of(
    st.text(max_size=80),
    st.binary(max_size=40).map(lambda b: b.decode("utf-8", "replace")),
    request_like.map(lambda b: orjson.dumps({"type": "response.create", **b}).decode()),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["response.create", "response.processed", "session.update"])},
        optional={
            "generate": st.one_of(st.just(False), st.booleans()),
            "model": st.sampled_from(["gpt-4o", "nope", ""]),
            "input": st.one_of(st.text(max_size=20), st.lists(st.text(max_size=8), max_size=3)),
            "previous_response_id": st.text(max_size=30),
            "background": st.booleans(),
            "store": st.booleans(),
        },
    ).map(lambda d: orjson.dumps(d).decode()),
)


def _acknowledgement(text: str) -> bool:
    try:
        message = orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return isinstance(message, dict) and message.get("type") == "response.processed"


def test_random_websocket_frames_are_answered_never_with_a_server_error(
    sim: Sim, make_gateway: Make
) -> None:
    gw = fuzz_gateway(make_gateway, sim)
    url = gw.url.replace("http", "ws") + "/v1/responses"
    bad: list[tuple[str, str]] = []
    with ws_client.connect(url, additional_headers=gw.headers()) as conn:

        @settings(FUZZ, max_examples=80)
        @given(socket_frames)
        def check(text: str) -> None:
            conn.send(text)
            if _acknowledgement(text):
                return  # gets no answer
            while True:
                try:
                    event = orjson.loads(conn.recv(timeout=10))
                except TimeoutError:
                    bad.append((text[:200], "no answer in 10 s"))
                    return
                kind = event.get("type") if isinstance(event, dict) else None
                if kind == "error":
                    if event.get("status", 500) >= 500:
                        bad.append((text[:200], str(event)[:300]))
                    return
                if kind in ("response.completed", "response.incomplete", "response.failed"):
                    return

        check()
    assert bad == [], bad[:5]
    assert httpx.get(f"{gw.url}/health").status_code == 200
    tracebacks = [line for line in gw.log_lines() if "Traceback" in str(line)]
    assert tracebacks == []
