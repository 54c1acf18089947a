"""The OpenAI Batch API through the gateway, with the official SDK's files/batches calls."""

from __future__ import annotations

import io
import json
import signal
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import openai
import pytest

from tests.support.procs import Gateway, GatewaySpec, Sim

Make = Callable[..., Gateway]
FAST_KEYS = {"alice": {"requests_per_minute": 1_000_000, "tokens_per_minute": 10**9}, "eve": {}}


def line(i: int, url: str = "/v1/chat/completions", **body: Any) -> str:
    return json.dumps(
        {
            "custom_id": f"item-{i}",
            "method": "POST",
            "url": url,
            "body": {
                "model": "gpt-4o",
                "messages": [{"role": "user", "content": f"item-{i}"}],
                "max_tokens": 3,
                **body,
            },
        }
    )


def upload(client: openai.OpenAI, lines: list[str]) -> str:
    data = ("\n".join(lines) + "\n").encode()
    return client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch").id


def start(client: openai.OpenAI, lines: list[str]) -> Any:
    return client.batches.create(
        input_file_id=upload(client, lines),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )


def wait_done(client: openai.OpenAI, batch_id: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "cancelled", "expired"):
            return batch
        assert time.monotonic() < deadline, batch
        time.sleep(0.2)


def jsonl(client: openai.OpenAI, file_id: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in client.files.content(file_id).text.splitlines() if x]


def sent_items(sim: Sim) -> Counter[str]:
    return Counter(
        r["body"]["messages"][0]["content"]
        for r in sim.records("/v1/chat/completions")
        if r["body"]["messages"][0]["content"].startswith("item-")
    )


def test_200_items_complete_with_usage_and_a_bad_line_is_reported(
    sim: Sim, make_gateway: Make
) -> None:
    gw = make_gateway(GatewaySpec(keys=FAST_KEYS), sim.url)
    client = gw.openai()
    lines = [line(i) for i in range(200)]
    lines.insert(50, "{this is not json")
    lines.insert(60, line(999, url="/v1/embeddings"))
    batch = start(client, lines)
    assert batch.request_counts.total == 202 and batch.errors.data[0].line == 51
    done = wait_done(client, batch.id)
    assert done.status == "completed"
    assert (done.request_counts.completed, done.request_counts.failed) == (200, 2)
    output = jsonl(client, done.output_file_id)
    assert sorted(o["custom_id"] for o in output) == sorted(f"item-{i}" for i in range(200))
    assert all(
        o["response"]["status_code"] == 200
        and o["response"]["body"]["usage"]["completion_tokens"] == 3
        for o in output
    )
    errors = {(e["custom_id"], e["error"]["code"]) for e in jsonl(client, done.error_file_id)}
    assert errors == {(None, "invalid_json"), ("item-999", "invalid_url")}
    assert sum(sent_items(sim).values()) == 200
    assert [b.id for b in client.batches.list()] == [batch.id]
    with pytest.raises(openai.NotFoundError):  # another key sees nothing of it
        gw.openai("eve").batches.retrieve(batch.id)


def test_whole_batch_problems_are_refused_at_once(sim: Sim, make_gateway: Make) -> None:
    gw = make_gateway(GatewaySpec(settings={"batch": {"max_file_bytes": 2000}}), sim.url)
    client = gw.openai()
    with pytest.raises(openai.BadRequestError, match="duplicate custom_id 'item-1'"):
        start(client, [line(1), line(2), line(1)])
    with pytest.raises(openai.APIStatusError) as too_big:
        upload(client, [line(i) for i in range(30)])
    assert too_big.value.status_code == 413
    with pytest.raises(openai.NotFoundError):
        client.batches.create(
            input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h"
        )


def _interactive(gw: Gateway, n: int) -> list[str]:
    """n interactive requests one after another: their request ids."""
    client = gw.openai()
    ids = []
    for _ in range(n):
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-4o", max_tokens=1, messages=[{"role": "user", "content": "interactive"}]
        )
        ids.append(raw.headers["x-request-id"])
    return ids


def test_interactive_latency_is_kept_while_a_batch_runs(
    make_sim: Callable[..., Sim], make_gateway: Make
) -> None:
    """The batch holds at most its share of the slots (batch.share 0.5 of 4), so an
    interactive request finds a free one at once instead of waiting behind a batch item.
    Asserted on what the upstream saw at once and on each request's own queue time,
    which a request waiting for a 100 ms batch item could not have: no latency median
    compared across two phases of a busy machine."""
    sim = make_sim("--latency-ms", "100")
    gw = make_gateway(
        GatewaySpec(keys=FAST_KEYS, toml={"token_scheduler": {"max_inflight": 4}}), sim.url
    )
    batch = start(gw.openai(), [line(i) for i in range(120)])
    deadline = time.monotonic() + 30
    while sim.stats()["inflight"] < 2:  # the batch fills its share of the slots
        assert time.monotonic() < deadline, "the batch never started"
        time.sleep(0.05)
    during = set(_interactive(gw, 8))
    assert gw.openai().batches.retrieve(batch.id).status == "in_progress"
    queued = [line["queue_ms"] for line in gw.access() if line["request_id"] in during]
    assert len(queued) == 8 and max(queued) < 100, queued
    # the batch's 2 slots and one interactive request: never all 4 slots at once
    assert sim.stats()["peak_inflight"] <= 3


def test_kill_9_halfway_then_restart_completes_every_item_once(
    make_sim: Callable[..., Sim], make_gateway: Make
) -> None:
    sim = make_sim("--latency-ms", "40")
    gw = make_gateway(GatewaySpec(keys=FAST_KEYS, settings={"batch": {"lease_sec": 2}}), sim.url)
    client = gw.openai()
    batch = start(client, [line(i) for i in range(200)])
    deadline = time.monotonic() + 30
    while client.batches.retrieve(batch.id).request_counts.completed < 80:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    gw.proc.send_signal(signal.SIGKILL)
    gw.proc.wait(10)
    gw.restart()
    done = wait_done(gw.openai(), batch.id)
    assert done.status == "completed" and done.request_counts.completed == 200
    output = jsonl(gw.openai(), done.output_file_id)
    assert Counter(o["custom_id"] for o in output) == Counter(f"item-{i}" for i in range(200))
    sent = sent_items(sim)
    assert set(sent) == {f"item-{i}" for i in range(200)}
    resent = [k for k, n in sent.items() if n > 1]
    assert len(resent) <= 16  # only what was in flight at the kill (batch.concurrency)


def test_cancel_stops_dispatch(make_sim: Callable[..., Sim], make_gateway: Make) -> None:
    sim = make_sim("--latency-ms", "100")
    gw = make_gateway(
        GatewaySpec(keys=FAST_KEYS, toml={"token_scheduler": {"max_inflight": 2}}), sim.url
    )
    client = gw.openai()
    batch = start(client, [line(i) for i in range(100)])
    time.sleep(0.6)
    assert client.batches.cancel(batch.id).status == "cancelling"
    done = wait_done(client, batch.id)
    assert done.status == "cancelled"
    sent = sum(sent_items(sim).values())
    time.sleep(0.5)
    assert sum(sent_items(sim).values()) == sent < 100  # nothing more went out
    assert done.request_counts.completed == len(jsonl(client, done.output_file_id))
