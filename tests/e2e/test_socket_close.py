"""A Responses WebSocket client that leaves mid-turn, over real sockets (websockets client
-> tokengate serve -> tokengate sim): its close frame is answered at once, echoing its
code (RFC 6455 §5.5.1), and its turn ends as an HTTP client's disconnect does: the
upstream request is closed, the slot freed, the key charged what was streamed, the
access line (499) and the ledger row written. The same for a turn still waiting for the
upstream's first byte, one still queued in the gateway, and a client that drops its TCP
connection without a close frame.

The client reads with `max_queue=None`: websockets' sync client stops reading its socket
once 16 messages wait unread (its own flow control), and `close()` does not drain them,
so with the default a client that closes during a fast stream cannot see the server's
answer to its close frame (whatever the server)."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from typing import Any

import httpx
import websockets.sync.client as ws_client
from websockets.sync.client import ClientConnection

from tests.support.procs import Gateway, GatewaySpec, Sim
from tests.support.waiting import wait_until

Make = Callable[..., Gateway]
ADMIN = "admin-socket-close-key-0123456789"
SLOW = ("--tokens-per-sec", "8", "--reply-tokens", "400")  # about 50 s a turn: still going
ASK = json.dumps({"type": "response.create", "model": "gpt-4o", "input": "hello"})


def _connect(gw: Gateway) -> ClientConnection:
    url = gw.url.replace("http", "ws") + "/v1/responses"
    return ws_client.connect(url, additional_headers=gw.headers(), max_queue=None)


def _until(conn: ClientConnection, kind: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    while not events or events[-1]["type"] != kind:
        events.append(json.loads(conn.recv(timeout=60)))
    return events


def _ledger(gw: Gateway) -> list[dict[str, Any]]:
    """The ledger's rows, once it has any (the settle is written after the access line)."""

    def rows() -> list[dict[str, Any]]:
        r = httpx.get(f"{gw.url}/admin/usage", headers={"authorization": f"Bearer {ADMIN}"})
        r.raise_for_status()
        return list(r.json()["data"])

    wait_until(lambda: bool(rows()), "the ledger row")
    return rows()


def _settled(gw: Gateway, sim: Sim, turns: int = 1) -> dict[str, Any]:
    """Once the upstream saw its request cancelled and the gateway logged the turn: its
    access line (the last one), every upstream slot free again."""
    wait_until(lambda: any(r["cancelled"] for r in sim.records()), "the upstream's cancel")
    wait_until(lambda: len(gw.access()) >= turns, "the access line")
    ready = httpx.get(f"{gw.url}/health/ready").json()
    wait_until(
        lambda: httpx.get(f"{gw.url}/health/ready").json()["domains"]["domain-a"]["inflight"] == 0,
        f"a free slot (was {ready['domains']['domain-a']})",
    )
    return gw.access()[-1]


def test_a_close_mid_stream_is_answered_and_the_turn_charged_what_was_streamed(
    make_sim: Callable[..., Sim], make_gateway: Make
) -> None:
    sim = make_sim(*SLOW)
    gw = make_gateway(GatewaySpec(settings={"admin_key": ADMIN}), sim.url)
    with _connect(gw) as conn:
        conn.send(ASK)
        _until(conn, "response.output_text.delta")
        conn.close(4000, "done here")
        answered = conn.protocol.close_rcvd
    assert answered is not None and (answered.code, answered.reason) == (4000, "done here")
    line = _settled(gw, sim)
    assert line["endpoint"] == "responses_ws" and line["status"] == 499, line
    (row,) = _ledger(gw)
    assert row["requests"] == 1 and row["failed_completion_tokens"] >= 1  # what was streamed


def test_a_close_with_the_answer_unread_is_answered(sim: Sim, make_gateway: Make) -> None:
    """The report's case: the whole (fast) answer is sent before the close arrives."""
    gw = make_gateway(GatewaySpec(), sim.url)
    with _connect(gw) as conn:
        conn.send(ASK)
        assert json.loads(conn.recv(timeout=60))["type"] == "response.created"
        conn.close()
        answered = conn.protocol.close_rcvd
    assert answered is not None and answered.code == 1000
    wait_until(lambda: len(gw.access()) == 1, "the access line")
    # ended (200) or cut at its last events (499, the close raced them): logged once
    assert gw.access()[0]["status"] in (200, 499)


def test_a_close_while_the_upstream_has_not_answered_is_answered_and_cancels_it(
    sim: Sim, make_gateway: Make
) -> None:
    gw = make_gateway(GatewaySpec(settings={"admin_key": ADMIN}), sim.url)
    sim.faults(hold=True)  # the upstream takes the request and answers nothing
    with _connect(gw) as conn:
        conn.send(ASK)
        wait_until(lambda: bool(sim.records()), "the request upstream")
        conn.close()
        answered = conn.protocol.close_rcvd
    assert answered is not None and answered.code == 1000
    line = _settled(gw, sim)
    assert line["status"] == 499, line
    assert _ledger(gw)[0]["requests"] == 1


def test_a_close_while_queued_in_the_gateway_never_reaches_the_upstream(
    sim: Sim, make_gateway: Make
) -> None:
    one_slot = {"token_scheduler": {"max_inflight": 1}}
    gw = make_gateway(GatewaySpec(toml=one_slot), sim.url)
    sim.faults(hold=True)
    with _connect(gw) as first, _connect(gw) as second:
        first.send(ASK)  # takes the one slot, held upstream
        wait_until(lambda: len(sim.records()) == 1, "the first request upstream")
        second.send(ASK)  # queued behind it, in the gateway
        wait_until(
            lambda: (
                httpx.get(f"{gw.url}/health/ready").json()["domains"]["domain-a"]["queue_depth"]
                == 1
            ),
            "the second turn queued",
        )
        second.close()
        answered = second.protocol.close_rcvd
        assert answered is not None and answered.code == 1000
        wait_until(lambda: len(gw.access()) == 1, "the queued turn's access line")
        (line,) = gw.access()
        assert line["status"] == 499, line
        sim.faults(hold=False)  # the first turn is served whole
        events = _until(first, "response.completed")
        assert events[0]["type"] == "response.created"
    assert len(sim.records()) == 1  # the queued turn was never sent


def test_a_dropped_tcp_connection_cancels_the_turn_and_charges_it(
    make_sim: Callable[..., Sim], make_gateway: Make
) -> None:
    sim = make_sim(*SLOW)
    gw = make_gateway(GatewaySpec(settings={"admin_key": ADMIN}), sim.url)
    with _connect(gw) as conn:
        conn.send(ASK)
        _until(conn, "response.output_text.delta")
        conn.socket.shutdown(socket.SHUT_RDWR)  # no close frame: the TCP connection ends
        line = _settled(gw, sim)
    assert line["status"] == 499, line
    (row,) = _ledger(gw)
    assert row["requests"] == 1 and row["failed_completion_tokens"] >= 1
