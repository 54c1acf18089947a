"""Issue 31, finding 2: a stored response belongs to the key that created it, whatever the
gateway forgot (a restart, an id table evicted by another key, a worker that never saw
the id). Attacked over real sockets: the openai SDK and httpx -> tokengate serve ->
tokengate sim. Another key's id and an id nobody created get the same 404 `not_found`,
and neither reaches an upstream."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import websockets.sync.client as ws_client

from tests.support.procs import Gateway, GatewaySpec, Redis, Sim, run_cli

Make = Callable[..., Gateway]
FOLLOWING = ("/v1/responses/",)  # the sim's record paths of retrieve/delete/cancel/items


def _followed(sim: Sim) -> list[str]:
    """What the upstream was asked about stored responses (anything but creations)."""
    return [
        f"{r['method']} {r['path']}"
        for r in sim.records()
        if r["path"].startswith(FOLLOWING) and r["path"] != "/v1/responses/input_tokens"
    ]


def _attack(gw: Gateway, victim_id: str, sim: Sim) -> None:
    """Key `mallory` tries everything on `victim_id`: each answer is exactly the answer
    for an id that never existed, and the upstream hears of none of it."""
    sim.clear()
    base = f"{gw.url}/v1/responses"
    h = gw.headers("mallory")
    for unknown in (victim_id, "resp_never_created_0000"):
        answers = [
            httpx.get(f"{base}/{unknown}", headers=h),
            httpx.get(f"{base}/{unknown}/input_items", headers=h),
            httpx.post(f"{base}/{unknown}/cancel", headers=h),
            httpx.delete(f"{base}/{unknown}", headers=h),
        ]
        for r in answers:
            assert r.status_code == 404, (r.request.method, r.request.url, r.text)
            error = r.json()["error"]
            assert error["code"] == "not_found" and error["type"] == "invalid_request_error"
            assert error["message"] == f"Response with id '{unknown}' not found."
        chained = httpx.post(
            base,
            headers=h,
            json={"model": "gpt-4o", "input": "go on", "previous_response_id": unknown},
        )
        assert chained.status_code == 400, chained.text
        assert chained.json()["error"]["code"] == "previous_response_not_found"
        assert chained.json()["error"]["message"] == (
            f"Previous response with id '{unknown}' not found."
        )
        event = _socket_chain(gw, unknown)
        assert event["type"] == "error" and event["status"] == 400, event
        assert event["error"]["code"] == "previous_response_not_found"
    assert _followed(sim) == []  # no upstream call, no fan-out over the domains
    assert sim.records("/v1/responses") == []  # the chained creations never went upstream


def _socket_chain(gw: Gateway, previous: str) -> dict[str, Any]:
    """Mallory chains from `previous` over the WebSocket mode: its first event."""
    url = gw.url.replace("http", "ws") + "/v1/responses"
    with ws_client.connect(url, additional_headers=gw.headers("mallory")) as conn:
        ask = {"type": "response.create", "model": "gpt-4o", "input": "go on"}
        conn.send(json.dumps({**ask, "previous_response_id": previous}))
        return dict(json.loads(conn.recv(timeout=30)))


def _victim_still_owns(gw: Gateway, victim_id: str) -> None:
    with gw.openai("alice") as alice:
        assert alice.responses.retrieve(victim_id).id == victim_id
        assert alice.responses.input_items.list(victim_id).data
        follow = alice.responses.create(
            model="gpt-4o", input="go on", previous_response_id=victim_id
        )
        assert follow.status == "completed"


def test_another_key_can_not_read_chain_or_delete_a_response_after_a_restart(
    sim: Sim, make_gateway: Make
) -> None:
    gw = make_gateway(GatewaySpec(keys={"alice": {}, "mallory": {}}), sim.url)
    with gw.openai("alice") as alice:
        victim = alice.responses.create(model="gpt-4o", input="my secret plan").id
    gw.restart()  # the gateway's id table is empty now; the database is not
    _attack(gw, victim, sim)
    _victim_still_owns(gw, victim)
    with gw.openai("alice") as alice:
        alice.responses.delete(victim)
        with pytest.raises(openai.NotFoundError):
            alice.responses.retrieve(victim)


def test_a_key_can_not_evict_another_keys_id_from_a_small_table(
    sim: Sim, make_gateway: Make
) -> None:
    spec = GatewaySpec(
        keys={"alice": {}, "mallory": {}}, settings={"responses": {"max_local_ids": 2}}
    )
    gw = make_gateway(spec, sim.url)
    with gw.openai("alice") as alice:
        victim = alice.responses.create(model="gpt-4o", input="my secret plan").id
    with gw.openai("mallory") as mallory:
        for i in range(3):  # pushes alice's id out of the gateway's memory
            mallory.responses.create(model="gpt-4o", input=f"filler {i}")
    _attack(gw, victim, sim)
    _victim_still_owns(gw, victim)


def test_a_replica_that_never_saw_the_id_still_knows_its_owner(
    sim: Sim, make_gateway: Make, tmp_path: Path
) -> None:
    """Two replicas without Redis share only the database (several workers, or a Redis
    outage, leave each process with its own id table just the same)."""
    shared = {"database": {"path": str(tmp_path / "shared.sqlite3")}}
    one = make_gateway(GatewaySpec(keys={"alice": {}, "mallory": {}}, settings=shared), sim.url)
    spec = GatewaySpec(keys={"alice": {}, "mallory": {}}, settings=shared, secrets=one.keys)
    two = make_gateway(spec, sim.url)
    with one.openai("alice") as alice:
        victim = alice.responses.create(model="gpt-4o", input="my secret plan").id
    _attack(two, victim, sim)
    _victim_still_owns(two, victim)


def test_replicas_sharing_redis_keep_owners_through_a_redis_outage(
    sim: Sim, make_gateway: Make, redis: Redis, tmp_path: Path
) -> None:
    """Redis is only for limits: with it gone, the owners are still the database's."""
    settings = {"database": {"path": str(tmp_path / "shared.sqlite3")}}
    env = {"TOKENGATE_REDIS_URL": redis.url}
    keys: dict[str, dict[str, Any]] = {"alice": {}, "mallory": {}}
    one = make_gateway(GatewaySpec(keys=keys, settings=settings, env=env), sim.url)
    spec = GatewaySpec(keys=keys, settings=settings, env=env, secrets=one.keys)
    two = make_gateway(spec, sim.url)
    with one.openai("alice") as alice:
        victim = alice.responses.create(model="gpt-4o", input="my secret plan").id
    redis.kill()
    _attack(two, victim, sim)
    _victim_still_owns(two, victim)


def test_owners_expire_with_the_responses_and_db_prune_deletes_them(
    sim: Sim, make_gateway: Make
) -> None:
    spec = GatewaySpec(keys={"alice": {}}, settings={"responses": {"id_ttl_sec": 1}})
    gw = make_gateway(spec, sim.url)
    with gw.openai("alice") as alice:
        old = alice.responses.create(model="gpt-4o", input="soon forgotten").id
    gw.stop()
    time.sleep(1.5)  # past its lifetime (a lower bound: a slower machine only adds to it)
    pruned = run_cli("db", *gw.args, "prune", env=gw.env)
    assert pruned.returncode == 0, pruned.stderr
    assert "1 expired stored-response owners deleted" in pruned.stdout
    gw.restart()
    r = httpx.get(f"{gw.url}/v1/responses/{old}", headers=gw.headers("alice"))
    assert r.status_code == 404  # past id_ttl_sec, unknown to every key, its creator too
