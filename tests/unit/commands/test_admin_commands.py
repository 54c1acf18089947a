"""`tokengate usage` and `tokengate audit` share one admin-key lookup and one way of
saying that the gateway did not answer (`report.admin_key`, `report.answered`)."""

from __future__ import annotations

import socket

import pytest

from app.commands.cli import main


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port  # nothing listens there once the socket is closed


@pytest.mark.parametrize("command", ["usage", "audit"])
def test_without_an_admin_key_each_command_says_so_and_exits_2(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("TOKENGATE_ADMIN_KEY", raising=False)
    assert main([command, "--target", "http://127.0.0.1:9"]) == 2
    said = capsys.readouterr().out
    assert said.startswith(f"tokengate {command}: no admin key")
    assert "--admin-key" in said and "TOKENGATE_ADMIN_KEY" in said


@pytest.mark.parametrize("command", ["usage", "audit"])
def test_a_gateway_that_cannot_be_reached_is_named_and_exits_1(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TOKENGATE_ADMIN_KEY", "adm-secret-value")
    target = f"http://127.0.0.1:{closed_port()}"
    assert main([command, "--target", target]) == 1
    said = capsys.readouterr().out
    assert said.startswith(f"tokengate {command}: cannot reach {target}")
    assert "adm-secret-value" not in said  # the key is never printed
