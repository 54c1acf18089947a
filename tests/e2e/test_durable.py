"""Durable shared state over real sockets: four `tokengate serve` replicas on one
PostgreSQL and one Redis, the simulated upstream counting what it billed.

- the ledger equals the upstream's own count after a Redis restart under load;
- SIGTERM writes every settled request (the flush interval set to a minute, so only the
  shutdown can have written them);
- a batch created through one replica is served by another, and survives `kill -9` of the
  replica running it: the other takes its lease over and completes it;
- a database `serve` can not use stops it with exit 2 and one line saying what to do.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.db import migrate
from tests.e2e.test_batches import FAST_KEYS, jsonl, line, sent_items, start, wait_done
from tests.support.postgres import Postgres
from tests.support.procs import Gateway, GatewaySpec, Redis, Sim, run_cli, start_gateway

ADMIN_KEY = "adm-e2e-durable-0123456789"
KEY = "tg-test-durable-key-0123456789"
Make = Callable[..., Gateway]


@pytest.fixture
def replicas(tmp_path: Path, postgres: Postgres) -> Iterator[Callable[..., list[Gateway]]]:
    """`n` gateways sharing one fresh PostgreSQL database (and whatever `env` adds)."""
    started: list[Gateway] = []

    def make(n: int, upstream: str, env: dict[str, str], **settings: Any) -> list[Gateway]:
        url = postgres.url(postgres.fresh_database())
        spec = GatewaySpec(
            keys=FAST_KEYS,
            secrets={"alice": KEY},
            settings=settings,
            env={"TOKENGATE_DATABASE_URL": url, "TOKENGATE_ADMIN_KEY": ADMIN_KEY, **env},
        )
        gws = [
            start_gateway(tmp_path / f"replica{i}", spec, upstream, wait=False) for i in range(n)
        ]
        started.extend(gws)
        return [gw.ready(timeout=40) for gw in gws]

    yield make
    for gw in started:
        gw.stop()


def usage(gw: Gateway, **params: str) -> list[dict[str, Any]]:
    r = httpx.get(
        f"{gw.url}/admin/usage",
        params=params,
        headers={"authorization": f"Bearer {ADMIN_KEY}"},
        timeout=30,
    )
    r.raise_for_status()
    return list(r.json()["data"])


def billed_by_ledger(rows: list[dict[str, Any]]) -> dict[str, int]:
    return {
        "requests": sum(r["requests"] - r["errors"] for r in rows),
        "prompt_tokens": sum(r["prompt_tokens"] for r in rows),
        "completion_tokens": sum(r["completion_tokens"] for r in rows),
    }


async def _load(gws: list[Gateway], redis: Redis, total: int, concurrency: int) -> Counter[int]:
    """`total` chat completions spread over the replicas; Redis killed a third of the way
    in and restarted at two thirds."""
    statuses: Counter[int] = Counter()
    sent = 0
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=60) as client:

        async def one(i: int) -> None:
            nonlocal sent
            async with gate:
                gw = gws[i % len(gws)]
                r = await client.post(
                    f"{gw.url}/v1/chat/completions",
                    headers={"authorization": f"Bearer {KEY}"},
                    json={
                        "model": "gpt-4o",
                        "max_tokens": 3 + i % 5,
                        "messages": [{"role": "user", "content": f"load {i} " * (1 + i % 7)}],
                    },
                )
                statuses[r.status_code] += 1
                sent += 1
                if sent == total // 3:
                    redis.kill()
                elif sent == 2 * total // 3:
                    redis.start()

        await asyncio.gather(*(one(i) for i in range(total)))
    return statuses


def test_the_ledger_equals_the_upstreams_count_across_a_redis_restart(
    sim: Sim, redis: Redis, replicas: Callable[..., list[Gateway]]
) -> None:
    gws = replicas(4, sim.url, {"TOKENGATE_REDIS_URL": redis.url})
    statuses = asyncio.run(_load(gws, redis, total=200, concurrency=24))
    assert statuses[200] >= 150, statuses  # Redis away: limits fail open, traffic goes on
    billed = sim.stats()["billed"]
    assert billed["requests"] == statuses[200]

    deadline = time.monotonic() + 15  # every replica flushes within its flush interval
    while (seen := billed_by_ledger(usage(gws[1]))) != billed:
        assert time.monotonic() < deadline, f"ledger {seen} vs upstream {billed}"
        time.sleep(0.2)
    # Any replica answers for the whole fleet, and a period can be asked for.
    assert billed_by_ledger(usage(gws[3], **{"from": str(int(time.time()) - 3600)})) == billed
    assert usage(gws[0], **{"to": "2001-01-01T00:00:00Z"}) == []


def test_sigterm_writes_every_settled_request(sim: Sim, make_gateway: Make) -> None:
    gw = make_gateway(
        GatewaySpec(keys=FAST_KEYS, settings={"ledger": {"flush_interval_sec": 60}}), sim.url
    )
    client = gw.openai()
    for i in range(12):
        client.chat.completions.create(
            model="gpt-4o", max_tokens=4, messages=[{"role": "user", "content": f"t {i}"}]
        )
    assert gw.stop() == 0
    with sqlite3.connect(gw.workdir / "tokengate.sqlite3") as db:
        requests, completion = db.execute(
            "SELECT sum(requests), sum(completion_tokens) FROM usage_minute"
        ).fetchone()
    assert (requests, completion) == (12, sim.stats()["billed"]["completion_tokens"])


def test_a_batch_is_served_by_any_replica_and_survives_kill_9_of_its_runner(
    make_sim: Callable[..., Sim], postgres: Postgres, replicas: Callable[..., list[Gateway]]
) -> None:
    sim = make_sim("--latency-ms", "40")
    gws = replicas(2, sim.url, {}, batch={"lease_sec": 2})
    batch = start(gws[0].openai(), [line(i) for i in range(200)])
    assert gws[1].openai().batches.retrieve(batch.id).status == "in_progress"

    deadline = time.monotonic() + 60
    while gws[1].openai().batches.retrieve(batch.id).request_counts.completed < 60:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    owner = _lease_owner(postgres, gws[0], batch.id)
    (runner,) = [gw for gw in gws if gw.proc.pid == int(owner.split(":")[1])]
    (survivor,) = [gw for gw in gws if gw is not runner]
    runner.proc.send_signal(signal.SIGKILL)
    runner.proc.wait(10)

    done = wait_done(survivor.openai(), batch.id, timeout=90)
    assert done.status == "completed" and done.request_counts.completed == 200
    output = jsonl(survivor.openai(), done.output_file_id)
    assert Counter(o["custom_id"] for o in output) == Counter(f"item-{i}" for i in range(200))
    sent = sent_items(sim)
    assert set(sent) == {f"item-{i}" for i in range(200)}
    resent = [k for k, n in sent.items() if n > 1]
    assert len(resent) <= 16  # only what was in flight at the kill (batch.concurrency)


def _lease_owner(postgres: Postgres, gw: Gateway, batch_id: str) -> str:
    url = gw.env["TOKENGATE_DATABASE_URL"]
    database = url.rsplit("/", 1)[1]
    return postgres.psql(f"SELECT lease_owner FROM batches WHERE id = '{batch_id}'", database)


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_cli(
        *args,
        env={
            "PATH": "/usr/bin:/bin",
            "TAOTOKEN_API_KEY": "sk-x",
            "TOKENGATE_KEYS": json.dumps([{"alias": "a", "key_sha256": "a" * 64}]),
            "TOKENGATE_LOGGING__OUTPUT": "stderr",
            **env,
        },
    )


def test_a_schema_behind_stops_serve_until_db_upgrade(tmp_path: Path) -> None:
    env = {"TOKENGATE_DATABASE__PATH": str(tmp_path / "tg.sqlite3")}
    assert _cli("db", "upgrade", "0001", env=env).returncode == 0
    serve = _cli("serve", "--port", "1", env=env)
    assert serve.returncode == 2 and "Traceback" not in serve.stderr
    assert "schema is at revision 0001" in serve.stderr
    assert "run `tokengate db upgrade`" in serve.stderr
    assert _cli("db", "check", env=env).returncode == 1
    upgraded = _cli("db", "upgrade", env=env)
    assert upgraded.returncode == 0 and f"0001 -> {migrate.head()}" in upgraded.stdout
    assert _cli("db", "check", env=env).returncode == 0

    backup = tmp_path / "backup.sqlite3"
    assert _cli("db", "backup", str(backup), env=env).returncode == 0
    with sqlite3.connect(backup) as copy:
        assert copy.execute("SELECT version_num FROM alembic_version").fetchone() == (
            migrate.head(),
        )


def test_an_unreachable_database_stops_serve_naming_it_without_the_password(
    tmp_path: Path,
) -> None:
    from tests.support.procs import free_port

    port = free_port()
    url = f"postgresql://tg:pw-must-not-show@127.0.0.1:{port}/tokengate"
    serve = _cli("serve", env={"TOKENGATE_DATABASE_URL": url})
    assert serve.returncode == 2 and "Traceback" not in serve.stderr
    assert f"127.0.0.1:{port}/tokengate unreachable" in serve.stderr
    assert "pw-must-not-show" not in serve.stderr


def test_pg_backup_is_a_pg_dump_of_the_shared_database(tmp_path: Path, postgres: Postgres) -> None:
    env = {"TOKENGATE_DATABASE_URL": postgres.url(postgres.fresh_database(), "postgres")}
    assert _cli("db", "upgrade", env=env).returncode == 0
    dump = tmp_path / "tg.dump"
    done = _cli("db", "backup", str(dump), env={**env, "PATH": _pg_path()})
    assert done.returncode == 0, done.stderr
    assert dump.read_bytes().startswith(b"PGDMP")  # pg_dump's custom format
    assert "pg-test-secret" not in done.stdout + done.stderr


def _pg_path() -> str:
    from tests.support.postgres import _bindir

    return f"{_bindir()}:/usr/bin:/bin"


def _on_own_postgres(pg: Postgres, connect_timeout_sec: int) -> dict[str, str]:
    """A gateway's environment on a PostgreSQL server of the test's own (it stops it)."""
    return {
        "TOKENGATE_DATABASE_URL": pg.url(pg.fresh_database()),
        "TOKENGATE_DATABASE__CONNECT_TIMEOUT_SEC": str(connect_timeout_sec),
        "TOKENGATE_ADMIN_KEY": ADMIN_KEY,
    }


def test_a_database_outage_keeps_serving_and_loses_no_ledger_row(
    sim: Sim, make_gateway: Make
) -> None:
    from tests.support.postgres import postgres_server

    with postgres_server() as pg:  # its own server: this test stops it
        env = _on_own_postgres(pg, connect_timeout_sec=2)
        gw = make_gateway(GatewaySpec(keys=FAST_KEYS, env=env), sim.url)
        client = gw.openai()

        def burst(n: int) -> None:
            for i in range(n):
                client.chat.completions.create(
                    model="gpt-4o", max_tokens=3, messages=[{"role": "user", "content": f"{i}"}]
                )

        burst(5)
        pg.stop()
        burst(10)  # served while the database is away
        deadline = time.monotonic() + 20
        while (db := httpx.get(f"{gw.url}/health/ready").json()["database"])["up"] is not False:
            assert time.monotonic() < deadline, db
            time.sleep(0.2)
        assert db["ledger_backlog_rows"] > 0 and "pg-test-secret" not in json.dumps(db)
        assert "tokengate_database_up 0.0" in gw.metrics()
        assert httpx.get(f"{gw.url}/health/ready").status_code == 200  # still serving

        pg.start()
        billed = sim.stats()["billed"]
        assert billed["requests"] == 15
        deadline = time.monotonic() + 30
        while True:
            r = httpx.get(f"{gw.url}/admin/usage", headers={"authorization": f"Bearer {ADMIN_KEY}"})
            if r.status_code == 200 and billed_by_ledger(r.json()["data"]) == billed:
                break
            assert time.monotonic() < deadline, r.text
            time.sleep(0.3)


def test_sigterm_while_the_database_is_away_spills_and_the_next_start_writes_it(
    sim: Sim, make_gateway: Make, tmp_path: Path
) -> None:
    from tests.support.postgres import postgres_server

    with postgres_server() as pg:  # its own server: this test stops it
        env = _on_own_postgres(pg, connect_timeout_sec=1)
        env["TOKENGATE_LEDGER__SPILL_DIR"] = str(tmp_path / "spill")
        settings = {"ledger": {"flush_interval_sec": 60}}  # nothing written before the stop
        gw = make_gateway(GatewaySpec(keys=FAST_KEYS, env=env, settings=settings), sim.url)
        client = gw.openai()
        for i in range(8):
            client.chat.completions.create(
                model="gpt-4o", max_tokens=3, messages=[{"role": "user", "content": f"{i}"}]
            )
        pg.stop()
        gw.stop()  # SIGTERM with the database away
        (spilled,) = (tmp_path / "spill").glob("ledger-spill-*.json")
        assert any("kept in" in str(x.get("msg")) for x in gw.log_lines())
        assert "pg-test-secret" not in spilled.read_text()

        pg.start()
        gw.restart()  # the same configuration: it writes the spill file first
        assert billed_by_ledger(usage(gw)) == sim.stats()["billed"]
        assert not spilled.exists()
