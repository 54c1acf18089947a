"""The Responses WebSocket mode's continuity, over real sockets: every "no WebSocket
here" is a 426 (other paths, a draining gateway), and a turn in flight when the gateway
is told to stop (SIGTERM) still ends with its terminal event before the socket closes."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable

import pytest
import websockets.sync.client as ws_client
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.support.procs import Gateway, GatewaySpec, Sim

Make = Callable[..., Gateway]
TERMINAL = {"response.completed", "response.incomplete", "response.failed"}


def ws_url(gw: Gateway, path: str) -> str:
    return gw.url.replace("http", "ws") + path


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/responses", "/v1/responses/x"])
def test_an_upgrade_anywhere_else_is_a_426(sim: Sim, make_gateway: Make, path: str) -> None:
    gw = make_gateway(GatewaySpec(), sim.url)
    with pytest.raises(InvalidStatus) as refused:
        ws_client.connect(ws_url(gw, path), additional_headers=gw.headers())
    assert refused.value.response.status_code == 426


def test_sigterm_mid_turn_ends_the_turn_then_refuses_new_sockets_with_426(
    make_sim: Callable[..., Sim], make_gateway: Make
) -> None:
    slow = make_sim("--tokens-per-sec", "8", "--reply-tokens", "24")  # about 3 s a turn
    gw = make_gateway(GatewaySpec(), slow.url)
    events: list[str] = []
    with ws_client.connect(ws_url(gw, "/v1/responses"), additional_headers=gw.headers()) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "gpt-4o", "input": "hello"}))
        while True:
            event = json.loads(ws.recv(timeout=30))
            events.append(event["type"])
            if event["type"] == "response.output_text.delta":
                break
        gw.proc.send_signal(signal.SIGTERM)  # the turn is streaming
        # while it drains, a new connection is told to use HTTP
        with pytest.raises(InvalidStatus) as refused:
            ws_client.connect(ws_url(gw, "/v1/responses"), additional_headers=gw.headers())
        assert refused.value.response.status_code == 426
        try:
            while True:
                events.append(json.loads(ws.recv(timeout=30))["type"])
        except ConnectionClosed as closed:
            assert closed.rcvd is not None and closed.rcvd.code == 1001
    assert events[-1] in TERMINAL and events[-1] == "response.completed"
