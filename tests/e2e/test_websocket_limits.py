"""Issue 31, findings 3 and 12: the Responses WebSocket mode under attack, over real
sockets (websockets client -> tokengate serve -> tokengate sim). Every frame, warm-ups
(`generate: false`) included, is size-limited, re-authorised and charged; a connection's
conversation is bounded; idle connections are closed; a key opens at most its cap."""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import websockets.sync.client as ws_client
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.e2e.chaos._support import rss_mib
from tests.e2e.test_limits import counter
from tests.support.procs import Gateway, GatewaySpec, Sim

Make = Callable[..., Gateway]
MIB = 1024 * 1024


def _url(gw: Gateway) -> str:
    return gw.url.replace("http", "ws") + "/v1/responses"


def _warm(conn: Any, text: str, previous: str | None = None) -> dict[str, Any]:
    """One warm-up; the event that ends its answer (`response.completed` or an error)."""
    ask: dict[str, Any] = {"type": "response.create", "model": "gpt-4o", "generate": False}
    ask["input"] = [{"role": "user", "content": text}]
    if previous is not None:
        ask["previous_response_id"] = previous
    conn.send(json.dumps(ask))
    while True:
        event = dict(json.loads(conn.recv(timeout=60)))
        if event["type"] in ("response.completed", "error"):
            return event


def _wait(check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached")


def test_chained_warm_ups_are_bounded_like_a_request_body(sim: Sim, make_gateway: Make) -> None:
    spec = GatewaySpec(
        settings={"server": {"max_body_bytes": 2 * MIB}},
        keys={"alice": {"requests_per_minute": 1000}},
    )
    gw = make_gateway(spec, sim.url)
    chunk = "x" * (200 * 1024)
    with ws_client.connect(_url(gw), additional_headers=gw.headers(), max_size=None) as conn:
        first = _warm(conn, "hello")
        before = rss_mib(gw.proc.pid)
        previous, outcomes = first["response"]["id"], []
        for _ in range(40):  # 40 x 200 KB, each continuing the last (8 MB of conversation)
            event = _warm(conn, chunk, previous)
            outcomes.append(event.get("status", 200))
            if event["type"] == "response.completed":
                previous = event["response"]["id"]
        after = rss_mib(gw.proc.pid)
    accepted = outcomes.count(200)
    assert 5 <= accepted <= 10, outcomes  # the conversation stops at 2 MiB...
    assert set(outcomes[accepted:]) == {413}, outcomes  # ...and everything past it is refused
    assert after - before < 48, (before, after)  # the issue saw +147 MB for the same frames
    assert sim.records("/v1/responses") == []  # warm-ups generate nothing upstream


def test_warm_ups_are_charged_against_the_request_limit(sim: Sim, make_gateway: Make) -> None:
    gw = make_gateway(GatewaySpec(keys={"slow": {"requests_per_minute": 2}}), sim.url)
    with ws_client.connect(_url(gw), additional_headers=gw.headers()) as conn:
        statuses = [_warm(conn, "hi").get("status", 200) for _ in range(4)]
    assert statuses == [200, 200, 429, 429]
    warmups = [a for a in gw.access() if a.get("endpoint") == "responses_ws.warmup"]
    assert [a["status"] for a in warmups] == statuses


def test_a_key_removed_after_connecting_is_refused_and_the_socket_closed(
    sim: Sim, make_gateway: Make
) -> None:
    gw = make_gateway(GatewaySpec(keys={"alice": {}, "bob": {}}), sim.url)
    with ws_client.connect(_url(gw), additional_headers=gw.headers("bob")) as conn:
        assert _warm(conn, "hi")["type"] == "response.completed"
        path = gw.workdir / "settings.json"
        settings = json.loads(path.read_text())
        settings["keys"] = [k for k in settings["keys"] if k["alias"] != "bob"]
        path.write_text(json.dumps(settings))
        gw.proc.send_signal(signal.SIGHUP)
        models = f"{gw.url}/v1/models"
        _wait(lambda: httpx.get(models, headers=gw.headers("bob")).status_code == 401)
        refused = _warm(conn, "again")
        assert refused["type"] == "error" and refused["status"] == 401
        with pytest.raises(ConnectionClosed) as closed:
            conn.recv(timeout=30)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


def test_idle_connections_are_closed(sim: Sim, make_gateway: Make) -> None:
    spec = GatewaySpec(settings={"server": {"websocket_idle_timeout_sec": 1}})
    gw = make_gateway(spec, sim.url)
    with ws_client.connect(_url(gw), additional_headers=gw.headers()) as conn:
        assert _warm(conn, "hi")["type"] == "response.completed"
        with pytest.raises(ConnectionClosed) as closed:
            conn.recv(timeout=60)  # sends nothing: the gateway hangs up
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
    assert "idle" in closed.value.rcvd.reason


def test_a_key_opens_at_most_its_cap_of_connections(sim: Sim, make_gateway: Make) -> None:
    spec = GatewaySpec(
        keys={"alice": {"max_websockets": 2}, "bob": {}},
        settings={"server": {"max_websockets_per_key": 3}},
    )
    gw = make_gateway(spec, sim.url)
    with contextlib.ExitStack() as alices:
        for _ in range(2):
            alices.enter_context(ws_client.connect(_url(gw), additional_headers=gw.headers()))
        with pytest.raises(InvalidStatus) as refused:
            _open(gw, "alice")
        answer = refused.value.response
        assert answer.status_code == 429
        assert json.loads(answer.body)["error"]["code"] == "websocket_connection_limit_reached"
        with contextlib.ExitStack() as bobs:  # another key: the server's default of 3
            for _ in range(3):
                bobs.enter_context(
                    ws_client.connect(_url(gw), additional_headers=gw.headers("bob"))
                )
            with pytest.raises(InvalidStatus):
                _open(gw, "bob")
    _wait(lambda: _opens(gw))  # closed connections give their places back
    refusals = counter(gw.metrics(), "tokengate_rate_limited_total", limit="websockets")
    assert refusals == 2


def _open(gw: Gateway, alias: str) -> None:
    with ws_client.connect(_url(gw), additional_headers=gw.headers(alias)):
        pass


def _opens(gw: Gateway) -> bool:
    """Alice can hold her two connections again."""
    try:
        with contextlib.ExitStack() as both:
            for _ in range(2):
                both.enter_context(ws_client.connect(_url(gw), additional_headers=gw.headers()))
    except InvalidStatus:
        return False
    return True
