"""The test harness's own guarantee: a test talks to the server it started.

`free_port` picks a port that is free now and bound only when the server starts, so two
test workers may pick the same one; the loser's health check was answered by the winner,
and its test then sent its requests to another test's server."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from tests.support import procs
from tests.support.procs import GatewaySpec, listens_on, start_gateway, start_sim


class _AnswersEverything(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def squatter() -> Iterator[int]:
    """Another test's server, already on the port our next `free_port` will pick."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _AnswersEverything)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def _first_pick(port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    real = procs.free_port
    picks = iter([port])
    monkeypatch.setattr(procs, "free_port", lambda: next(picks, None) or real())


def test_a_sim_whose_port_was_taken_moves_to_another(
    squatter: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    _first_pick(squatter, monkeypatch)
    sim = start_sim()
    try:
        assert sim.port != squatter and listens_on(sim.proc.pid, sim.port)
        assert "statuses" in sim.stats()  # the sim's own answer, not the squatter's {}
    finally:
        sim.stop()


def test_a_gateway_whose_port_was_taken_moves_to_another(
    squatter: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _first_pick(squatter, monkeypatch)
    gw = start_gateway(tmp_path, GatewaySpec())
    try:
        assert gw.port != squatter and listens_on(gw.proc.pid, gw.port)
        assert httpx.get(f"{gw.url}/v1/models", headers=gw.headers()).status_code == 200
    finally:
        gw.stop()


def test_a_taken_port_the_caller_chose_is_an_error_not_a_move(squatter: int) -> None:
    with pytest.raises(procs.PortTaken):
        start_sim(port=squatter)
