"""Runs batches: every item through the same pipeline as interactive traffic.

An item is a `ClientRequest` of the submitting key (its limits, its ledger) in the `batch`
queue class, which a domain serves only after every interactive class and only within
`batch.share` of its slots: a batch uses the capacity interactive traffic leaves.

    claim lease ──► for each pending item (≤ concurrency in flight):
                      handle() ─► 200 + valid output  → done   (stored with its usage)
                               ─► 429 / 503           → wait the hint, try again
                               ─► other error         → failed (stored with its body)
                ──► no pending item left: write output/error files, completed|cancelled

Cancelling stops new items; those in flight finish and are kept.

Each claimed batch runs as its own task, so a deferred background response (a one-item
batch, `held.py`) never waits behind a long batch; held responses share one gate of
`batch.concurrency` slots per process. Work held for a window (`deferral.py`) is not read
again before the instant it would be released (or a wake-up: a new batch or response).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import orjson

from app.batch import held
from app.batch.deferral import decide, defer_window, note
from app.batch.service import item_error, new_id, request_counts
from app.batch.store import BatchStore, Item, StoredFile
from app.batch.valve import Valve
from app.config.schema import BatchConfig
from app.db.engine import DatabaseUnavailable
from app.errors import (
    FlexUnavailable,
    GatewayError,
    RateLimited,
    ServiceUnavailable,
    UpstreamRejected,
)
from app.kinds import BatchStatus, DeferOutcome, ItemState, QueueClass
from app.pipeline.core import Pipeline
from app.pipeline.replies import JsonAnswer
from app.pipeline.request import CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES, Endpoint
from app.pipeline.wire import parse_call
from app.runtime import KeySpec

log = logging.getLogger("tokengate.batch")
_ENDPOINTS: dict[str, Endpoint] = {e.path: e for e in (CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES)}
_MAX_WAIT = 30.0
_FINAL = {
    BatchStatus.IN_PROGRESS: BatchStatus.COMPLETED,
    BatchStatus.CANCELLING: BatchStatus.CANCELLED,
}


class BatchRunner:
    def __init__(
        self,
        store: BatchStore,
        cfg: BatchConfig,
        pipeline: Pipeline,
        key_of: Callable[[str], KeySpec | None],
    ) -> None:
        self.store = store
        self.cfg = cfg
        self.pipeline = pipeline
        self.key_of = key_of
        self.owner = f"{os.uname().nodename}:{os.getpid()}:{os.urandom(4).hex()}"
        self.wake = asyncio.Event()
        self.held: dict[str, dict[str, Any]] = {}  # work held for a window, by id
        self.running: dict[str, asyncio.Task[None]] = {}
        self._until: dict[str, float] = {}  # held work: not read again before this instant
        self._responses = asyncio.Semaphore(cfg.concurrency)  # held responses in flight
        self.valve = Valve()  # released at the pace of the domain's idle quota
        self._runtime = pipeline.runtime  # the settings the held work was judged under

    async def run(self) -> None:
        """The runner's loop (one task, owned by the gateway; each batch is a task of its
        own, in this loop's task group). The database going away pauses it (items in flight
        stay pending); it resumes when the database returns."""
        async with asyncio.TaskGroup() as group:
            while True:
                woken = self.wake.is_set()
                self.wake.clear()
                try:
                    claimed = await self.store.claim(self.owner, self.cfg.lease_sec)
                    self._start(group, claimed, woken)
                except DatabaseUnavailable:
                    pass  # the database logs its outage once; /health/ready shows it
                except Exception:
                    log.exception("batch runner pass failed; trying again")
                try:
                    await asyncio.wait_for(self.wake.wait(), timeout=self.cfg.lease_sec / 3)
                except TimeoutError:
                    pass

    def _start(self, group: asyncio.TaskGroup, claimed: list[str], woken: bool) -> None:
        now = time.time()
        if self.pipeline.runtime is not self._runtime:  # a reload may move a window
            self._runtime, woken = self.pipeline.runtime, True
        for gone in set(self.held) - set(claimed):
            self.held.pop(gone, None)  # finished, cancelled or deleted elsewhere
        for batch_id in claimed:
            if batch_id in self.running or (not woken and self._until.get(batch_id, 0) > now):
                continue
            self.running[batch_id] = group.create_task(self._guarded(batch_id))

    async def _guarded(self, batch_id: str) -> None:
        """One batch's run; what goes wrong is logged, and the next pass tries again."""
        try:
            await self._run_batch(batch_id)
        except DatabaseUnavailable:
            pass
        except Exception:
            log.exception("batch %s: run failed; trying again", batch_id)
        finally:
            self.running.pop(batch_id, None)

    async def release(self) -> None:
        await self.store.release(self.owner)

    async def _run_batch(self, batch_id: str) -> None:
        found = await self.store.get_batch(batch_id)
        if found is None:
            return
        owner, batch = found
        if batch["status"] == BatchStatus.IN_PROGRESS and time.time() > batch["expires_at"]:
            batch["status"] = BatchStatus.EXPIRED
        if batch["status"] == BatchStatus.IN_PROGRESS:
            if await self._held(batch, owner):
                return  # its items wait, pending, for the window
            await self._run_items(batch, owner)
        self.held.pop(batch_id, None)
        self._until.pop(batch_id, None)
        await self._finalize(batch_id)

    async def _held(self, batch: dict[str, Any], owner: str) -> bool:
        """Whether the batch waits for its key's or `batch.defer_window` (deferral.py)."""
        settings = self.pipeline.runtime.settings
        key = self.key_of(owner)
        response = batch.get("kind") == held.KIND
        domain = batch.get("domain") if response else (None if key is None else key.domain)
        window = defer_window(settings, None if key is None else key.defer_window, domain)
        if window is None and "tokengate_deferral" not in batch:
            return False
        cfg, now = self.cfg, time.time()
        pending = (await self.store.counts(batch["id"])).get(ItemState.PENDING, 0)
        decision = decide(
            self.pipeline.pricing.timetable,
            window,
            now,
            float(batch["expires_at"]),
            pending,
            cfg.item_estimate_sec,
            cfg.concurrency,
            cfg.defer_margin_sec,
        )
        kind = held.KIND if response else "batch"
        if note(batch, decision, now):
            if response:  # the client reads it on its Response
                batch["response"]["tokengate_deferral"] = batch["tokengate_deferral"]
                if not decision.hold:
                    batch["response"]["status"] = "in_progress"
            await self.store.save_batch(batch)
            outcome = DeferOutcome.EARLY_RELEASED if decision.early else DeferOutcome.RELEASED
            self.pipeline.metrics.record_deferred(
                DeferOutcome.HELD if decision.hold else outcome, kind
            )
            if decision.early:
                log.warning(
                    "%s %s released early: it would miss its deadline waiting for window %r",
                    kind,
                    batch["id"],
                    window,
                )
        if decision.hold:
            self.held[batch["id"]] = {
                "kind": kind,
                "id": batch["id"],
                "batch": batch["id"],
                "key": owner,
                "pending": pending,
                **batch["tokengate_deferral"],
            }
            starts = decision.release_at or now
            self._until[batch["id"]] = min(starts, _latest_start(batch, pending, cfg))
        else:
            self.held.pop(batch["id"], None)
        return decision.hold

    async def _run_items(self, batch: dict[str, Any], owner: str) -> None:
        endpoint = _ENDPOINTS[batch["endpoint"]]
        response = batch.get("kind") == held.KIND
        gate = self._responses if response else asyncio.Semaphore(self.cfg.concurrency)
        renewed = time.monotonic()
        async with asyncio.TaskGroup() as group:
            for item in await self.store.pending(batch["id"]):
                await gate.acquire()
                if not await self._still_ours(batch["id"], renewed):
                    gate.release()
                    break  # cancelled, or another process holds it now
                if time.monotonic() - renewed > self.cfg.lease_sec / 3:
                    renewed = time.monotonic()
                group.create_task(self._item(endpoint, owner, item, gate))

    async def _still_ours(self, batch_id: str, renewed: float) -> bool:
        found = await self.store.get_batch(batch_id)
        if found is None or found[1]["status"] != BatchStatus.IN_PROGRESS:
            return False
        if time.monotonic() - renewed > self.cfg.lease_sec / 3:
            return batch_id in await self.store.claim(self.owner, self.cfg.lease_sec)
        return True

    async def _item(
        self, endpoint: Endpoint, owner: str, item: Item, gate: asyncio.Semaphore
    ) -> None:
        try:
            state, result = await self._attempt_until_settled(endpoint, owner, item)
            await self.store.finish_item(item, state, result)
        except Exception:
            log.exception("batch item %s/%s crashed; left pending", item.batch_id, item.custom_id)
        finally:
            gate.release()

    async def _attempt_until_settled(
        self, endpoint: Endpoint, owner: str, item: Item
    ) -> tuple[str, dict[str, Any]]:
        key = self.key_of(owner)
        if key is None:
            return ItemState.FAILED, item_error(
                item.custom_id, "key_revoked", "the key that created this batch no longer exists"
            )
        raw = orjson.dumps(item.request)
        request_id = f"req_batch_{item.batch_id[-8:]}_{item.idx}"
        while True:
            try:
                call = parse_call(endpoint, raw, key, request_id, {}, time.perf_counter())
                call.priority = QueueClass.BATCH
                await self.valve.idle(self.pipeline.planner.plan(call)[1][0])
                call.started = time.perf_counter()  # its queue wait starts past the valve
                answer = await self.pipeline.handle(call)
            except (RateLimited, ServiceUnavailable, FlexUnavailable) as busy:
                await asyncio.sleep(min(busy.retry_after or 1.0, _MAX_WAIT))
                continue
            except UpstreamRejected as exc:
                body = _json(exc.raw_body)
                return ItemState.FAILED, item_error(
                    item.custom_id,
                    "upstream_rejected",
                    f"the upstream answered {exc.status}",
                    {"status_code": exc.status, "request_id": request_id, "body": body},
                )
            except GatewayError as exc:
                return ItemState.FAILED, item_error(
                    item.custom_id,
                    exc.code or exc.type,
                    exc.message,
                    {"status_code": exc.status, "request_id": request_id, "body": exc.body()},
                )
            assert isinstance(answer, JsonAnswer)
            return _validated(item, answer, request_id, endpoint)

    async def _finalize(self, batch_id: str) -> None:
        found = await self.store.get_batch(batch_id)
        if found is None:
            return
        owner, batch = found
        counts = await self.store.counts(batch_id)
        if batch["status"] == BatchStatus.IN_PROGRESS and counts.get(ItemState.PENDING):
            return  # not done yet (lease lost); whoever holds it will finish
        now = int(time.time())
        results = await self.store.results(batch_id)
        if batch.get("kind") == held.KIND:
            state, result = results[0] if results else (None, None)
            held.settled(batch, state, result)
            final = _FINAL.get(batch["status"], batch["status"])
            batch["status"], batch[f"{final}_at"] = final, now
            await self.store.save_batch(batch)
            log.info("held response %s: %s", batch_id, batch["response"]["status"])
            return
        batch["finalizing_at"] = now
        batch["output_file_id"] = await self._write(
            owner, batch_id, "output", [r for state, r in results if state == ItemState.DONE]
        )
        batch["error_file_id"] = await self._write(
            owner, batch_id, "error", [r for state, r in results if state == ItemState.FAILED]
        )
        batch["request_counts"] = request_counts(counts)
        final = _FINAL.get(batch["status"], batch["status"])
        batch["status"] = final
        batch[f"{final}_at"] = now
        await self.store.save_batch(batch)
        log.info("batch %s %s: %s", batch_id, final, batch["request_counts"])

    async def _write(
        self, owner: str, batch_id: str, kind: str, lines: list[dict[str, Any]]
    ) -> str | None:
        if not lines:
            return None
        content = b"".join(orjson.dumps(line) + b"\n" for line in lines)
        f = StoredFile(
            new_id("file-"),
            owner,
            f"batch_{kind}",
            f"{batch_id}_{kind}.jsonl",
            len(content),
            int(time.time()),
        )
        await self.store.add_file(f, content)
        return f.id


def _latest_start(batch: dict[str, Any], pending: int, cfg: BatchConfig) -> float:
    """The last instant held work can start and still end before its deadline (when
    `decide` would release it early)."""
    needed = pending * cfg.item_estimate_sec / max(1, cfg.concurrency) + cfg.defer_margin_sec
    return float(batch["expires_at"]) - needed


def _json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {"raw": raw.decode("utf-8", "replace")}


def _validated(
    item: Item, answer: JsonAnswer, request_id: str, endpoint: Endpoint
) -> tuple[str, dict[str, Any]]:
    """Check each sub-task's status and output before recording it done (docs/design.md)."""
    body = _json(answer.body)
    response = {"status_code": answer.status, "request_id": request_id, "body": body}
    listing = {EMBEDDINGS: "data", RESPONSES: "output"}.get(endpoint, "choices")
    if not isinstance(body, dict) or not body.get(listing) or "usage" not in body:
        return ItemState.FAILED, item_error(
            item.custom_id, "invalid_output", f"the answer has no {listing} or no usage", response
        )
    if endpoint is RESPONSES:  # a held response: where it is stored upstream (held.py)
        response["domain"] = answer.headers.get("x-tokengate-domain")
    return ItemState.DONE, {
        "id": new_id("batch_req_"),
        "custom_id": item.custom_id,
        "response": response,
        "error": None,
    }
