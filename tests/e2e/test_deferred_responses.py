"""Background responses deferred to an off-peak window over real sockets (`tokengate
serve` + `tokengate sim`, the official openai SDK): answered `queued` at once, held in the
database across a restart, shown in /admin/status and counted, invisible to another key,
cancellable by their own; and, on idle quota, run and answered `completed`."""

from __future__ import annotations

import signal
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.test_deferred_batches import ADMIN, ADMIN_H, deferred_count, wait_for
from tests.support.procs import Gateway, GatewaySpec, Sim

Make = Callable[..., Gateway]
FAST = {"requests_per_minute": 1_000_000, "tokens_per_minute": 10**9}


def spec(window: dict[str, Any], **alice: Any) -> GatewaySpec:
    keys = {"alice": {**FAST, **alice}, "eve": dict(FAST)}
    settings = {"admin_key": ADMIN, "billing": {"windows": {"offpeak": window}}}
    return GatewaySpec(keys=keys, settings=settings)


def later() -> tuple[dict[str, str], datetime]:
    opens = (datetime.now(UTC) + timedelta(hours=6)).replace(second=0, microsecond=0)
    closes = opens + timedelta(hours=1)
    return {"start": opens.strftime("%H:%M"), "end": closes.strftime("%H:%M")}, opens


def upstream_responses(sim: Sim) -> int:
    return len(sim.records("/v1/responses"))


def test_a_deferred_background_response_is_queued_and_survives_the_replicas_death(
    sim: Sim, make_gateway: Make
) -> None:
    window, opens = later()
    gw = make_gateway(spec(window, defer_requests="background"), sim.url)
    alice = gw.openai("alice")
    made = alice.responses.create(model="gpt-4o", input="write me an essay", background=True)
    assert made.status == "queued" and made.id.startswith("resp_tgd") and made.background
    got = wait_for(
        lambda: (r := alice.responses.retrieve(made.id)).model_extra.get("tokengate_deferral") and r
    )
    assert got.status == "queued"
    assert got.model_extra["tokengate_deferral"]["release_at"] == opens.isoformat()
    status = httpx.get(f"{gw.url}/admin/status", headers=ADMIN_H, timeout=10).json()
    (shown,) = status["deferred"]
    assert (shown["kind"], shown["id"], shown["key"], shown["window"]) == (
        "response",
        made.id,
        "alice",
        "offpeak",
    )
    assert deferred_count(gw, "held", "response") == 1
    gw.proc.send_signal(signal.SIGKILL)  # the replica dies: nothing is flushed or released
    gw.proc.wait(10)
    gw.restart()
    again = gw.openai("alice").responses.retrieve(made.id)
    assert again.status == "queued"
    shown_again = wait_for(
        lambda: httpx.get(f"{gw.url}/admin/status", headers=ADMIN_H, timeout=10).json()["deferred"]
    )
    assert [d["id"] for d in shown_again] == [made.id]
    assert upstream_responses(sim) == 0  # nothing went upstream
    items = gw.openai("alice").responses.input_items.list(made.id)
    assert items.data[0].content[0].text == "write me an essay"


def test_another_key_can_neither_see_nor_cancel_a_held_response(
    sim: Sim, make_gateway: Make
) -> None:
    window, _ = later()
    gw = make_gateway(spec(window, defer_requests="background"), sim.url)
    alice, eve = gw.openai("alice"), gw.openai("eve")
    made = alice.responses.create(model="gpt-4o", input="my secret plan", background=True)
    unknown = "resp_tgd" + "0" * 24
    for rid in (made.id, unknown):
        with pytest.raises(openai.NotFoundError) as seen:
            eve.responses.retrieve(rid)
        assert "my secret plan" not in str(seen.value.body)
        with pytest.raises(openai.NotFoundError):
            eve.responses.cancel(rid)
        with pytest.raises(openai.NotFoundError):
            eve.responses.delete(rid)
        with pytest.raises(openai.NotFoundError):
            eve.responses.input_items.list(rid)
    with pytest.raises(openai.NotFoundError):
        eve.batches.retrieve(made.id)  # nor through the batches API (same table)
    with pytest.raises(openai.NotFoundError):
        alice.batches.retrieve(made.id)
    assert alice.batches.list().data == []
    assert alice.responses.retrieve(made.id).status == "queued"  # untouched
    assert alice.responses.cancel(made.id).status == "cancelled"
    assert alice.responses.retrieve(made.id).status == "cancelled"
    status = wait_for(
        lambda: (
            not httpx.get(f"{gw.url}/admin/status", headers=ADMIN_H, timeout=10).json()["deferred"]
        )
    )
    assert status
    assert upstream_responses(sim) == 0


def test_on_idle_quota_a_response_that_asks_is_run_and_completed(
    sim: Sim, make_gateway: Make
) -> None:
    window, _ = later()
    gw = make_gateway(spec(window, defer_window="none"), sim.url)
    alice = gw.openai("alice")
    made = alice.responses.create(
        model="gpt-4o",
        input="summarise this",
        background=True,
        metadata={"tokengate_defer": "true", "job": "nightly"},
    )
    assert made.status == "queued" and made.id.startswith("resp_tgd")
    assert made.metadata == {"job": "nightly"}
    done = wait_for(
        lambda: (r := alice.responses.retrieve(made.id)).status in ("completed", "failed") and r
    )
    assert done.status == "completed", done
    assert done.id == made.id and done.output and done.usage.output_tokens > 0
    (sent,) = sim.records("/v1/responses")
    assert "background" not in sent["body"] and "tokengate_defer" not in str(sent["body"])
    assert deferred_count(gw, "held", "response") == 0  # idle quota: never held
    # a later turn continues it by the gateway's id; upstream, by the upstream's own
    with pytest.raises(openai.BadRequestError) as refused:  # not another key's to continue
        gw.openai("eve").responses.create(
            model="gpt-4o", input="and the rest?", previous_response_id=made.id
        )
    assert refused.value.code == "previous_response_not_found"
    turn = alice.responses.create(model="gpt-4o", input="and then?", previous_response_id=made.id)
    assert turn.status == "completed"  # the sim refuses an id it did not store: it knew it
    continued = sim.records("/v1/responses")[-1]["body"]["previous_response_id"]
    assert continued.startswith("resp_") and not continued.startswith("resp_tgd")


def test_a_plain_background_response_is_not_deferred(sim: Sim, make_gateway: Make) -> None:
    window, _ = later()
    gw = make_gateway(spec(window), sim.url)
    made = gw.openai("alice").responses.create(model="gpt-4o", input="now", background=True)
    assert not made.id.startswith("resp_tgd")
    assert upstream_responses(sim) == 1
