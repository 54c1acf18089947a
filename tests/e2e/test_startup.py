"""Starting for real: the banner `serve` prints on the terminal, and `tokengate check`
catching, ahead of time, each thing `serve` refuses (real processes throughout)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.procs import (
    UPSTREAM_KEY,
    Gateway,
    GatewaySpec,
    Sim,
    digest,
    free_port,
    run_cli,
    wait_http,
)

Make = Callable[..., Gateway]


def terminal(gw: Gateway) -> str:
    """What `serve` wrote to its stdout and stderr (the test harness keeps both)."""
    return (gw.workdir / "stdout.log").read_text()


def test_the_banner_reaches_the_terminal_when_the_logs_go_to_a_file(
    sim: Sim, make_gateway: Make
) -> None:
    gw = make_gateway(GatewaySpec(), sim.url)
    wait_http(f"{gw.url}/health/ready", proc=gw.proc)
    text = terminal(gw)
    assert f"listening on http://127.0.0.1:{gw.port} (1 worker)" in text
    assert "domain    domain-a: models discovered from the upstream's /v1/models" in text
    assert f"upstream {sim.url} (direct); key from $TAOTOKEN_API_KEY" in text
    assert "default model claude-sonnet; fallback gpt-4o" in text
    assert "1 gateway key; admin API off" in text
    assert "limits and quotas in-process" in text
    assert f"JSON lines to {gw.log_path}, level info" in text
    assert "tokengate: serving; domain-a healthy" in text
    assert UPSTREAM_KEY not in text and gw.key not in text
    assert not any(line.startswith("{") for line in text.splitlines())  # the log is elsewhere


@pytest.mark.slow
def test_with_workers_the_supervisor_prints_the_banner_once(sim: Sim, make_gateway: Make) -> None:
    gw = make_gateway(GatewaySpec(args=["--workers", "2"]), sim.url)
    text = terminal(gw)
    assert text.count("listening on") == 1 and "(2 workers)" in text
    assert "split 1/2 per worker" in text


@pytest.fixture
def listening() -> Iterator[int]:
    """A port something else already listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def cli(env: dict[str, str], *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env=env, timeout=timeout)


def environment(tmp_path: Path, upstream: str, **extra: str) -> dict[str, str]:
    """The seed files as shipped, with what a trial on this host overrides."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "TAOTOKEN_API_KEY": UPSTREAM_KEY,
        "TOKENGATE_API_ENDPOINT": upstream,
        "TOKENGATE_KEYS": json.dumps([{"alias": "a", "key_sha256": digest("tg-startup-key")}]),
        "TOKENGATE_LOGGING__OUTPUT": "stderr",
        "TOKENGATE_DATABASE__PATH": str(tmp_path / "tokengate.sqlite3"),
        "TOKENGATE_HEALTH_CHECK__ENABLED": "false",
    }
    env.update(extra)
    return env


def test_a_taken_port_stops_serve_before_the_banner_and_check_says_so(
    sim: Sim, tmp_path: Path, listening: int
) -> None:
    env = environment(tmp_path, sim.url)
    served = cli(env, "serve", "--port", str(listening), timeout=60)
    assert served.returncode == 1
    assert f"tokengate: cannot listen: 127.0.0.1:{listening} is already in use" in served.stderr
    assert "listening on" not in served.stderr and "Traceback" not in served.stderr
    checked = cli(env, "check", "--port", str(listening))
    assert checked.returncode == 1, checked.stdout
    assert f"FAILED: listen: 127.0.0.1:{listening} is already in use" in checked.stdout
    assert "16/16 ok" in checked.stdout  # the chain itself is fine: only serve would fail
    assert "`tokengate serve` would not start" in checked.stdout.splitlines()[-1]


@pytest.mark.skipif(Path("/var/log/supernode").exists(), reason="the seed's log dir exists here")
def test_check_refuses_the_seed_log_directory_that_serve_refuses(sim: Sim, tmp_path: Path) -> None:
    env = environment(tmp_path, sim.url)
    del env["TOKENGATE_LOGGING__OUTPUT"]  # the seed's /var/log/supernode/token_scheduler.log
    port = str(free_port())
    served = cli(env, "serve", "--port", port, timeout=60)
    assert served.returncode == 2
    assert "directory /var/log/supernode does not exist" in served.stderr
    checked = cli(env, "check", "--port", port)
    assert checked.returncode == 1
    assert (
        "FAILED: log output /var/log/supernode/token_scheduler.log: directory "
        "/var/log/supernode does not exist. Fix: create it, or set logging.output"
    ) in checked.stdout
    fixed = cli({**env, "TOKENGATE_LOGGING__OUTPUT": "stderr"}, "check", "--port", port)
    assert fixed.returncode == 0, fixed.stdout
    assert f"ok: listen on 127.0.0.1:{port}" in fixed.stdout


def test_check_says_when_a_configured_store_can_not_be_opened(sim: Sim, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    env = environment(
        tmp_path,
        sim.url,
        TOKENGATE_REDIS_URL=f"redis://:s3cret-pw@127.0.0.1:{free_port()}/0",
        TOKENGATE_DATABASE__PATH=str(blocker / "tokengate.sqlite3"),
    )
    checked = cli(env, "check", "--port", str(free_port()))
    assert checked.returncode == 1
    out = checked.stdout
    assert f"FAILED: database {blocker / 'tokengate.sqlite3'}: database.path " in out
    assert "its directory can not be created" in out
    assert "FAILED: redis 127.0.0.1:" in out and "ConnectionError" in out
    assert "s3cret-pw" not in out
    # and serve, on the same database path, does not start either
    served = cli(env, "serve", "--port", str(free_port()), timeout=60)
    assert served.returncode == 2
    assert "its directory can not be created" in served.stderr
    assert "Traceback" not in served.stderr


def test_check_shows_each_probe_as_it_ends_and_how_long_a_timeout_waited(
    make_sim: Callable[..., Sim], tmp_path: Path
) -> None:
    slowish = make_sim("--latency-ms", "100")
    checked = cli(environment(tmp_path, slowish.url), "check", "--port", str(free_port()))
    assert checked.returncode == 0, checked.stdout
    assert "      probes: ................\n" in checked.stdout  # one mark per finished probe
    stuck = make_sim("--latency-ms", "3000")
    env = environment(tmp_path, stuck.url, TOKENGATE_TOKEN_SCHEDULER__TIMEOUT_MS="400")
    timed_out = cli(env, "check", "--port", str(free_port()))
    assert timed_out.returncode == 1
    assert f"timeout: no answer from {stuck.url} within 0.4 s (token_scheduler.timeout_ms)" in (
        timed_out.stdout
    )


def test_check_says_when_the_database_serve_needs_is_unreachable(sim: Sim, tmp_path: Path) -> None:
    port = free_port()
    env = environment(
        tmp_path, sim.url, TOKENGATE_DATABASE_URL=f"postgresql://gw:pg-pw-4242@127.0.0.1:{port}/tg"
    )
    checked = cli(env, "check", "--port", str(free_port()))
    assert checked.returncode == 1
    assert f"FAILED: database postgresql://gw:***@127.0.0.1:{port}/tg: database " in checked.stdout
    assert "unreachable" in checked.stdout and "pg-pw-4242" not in checked.stdout
    served = cli(env, "serve", "--port", str(free_port()), timeout=60)
    assert served.returncode == 2 and "unreachable" in served.stderr
