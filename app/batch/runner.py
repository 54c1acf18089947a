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
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import orjson

from app.batch.deferral import decide, defer_window, note
from app.batch.service import item_error, new_id, request_counts
from app.batch.store import BatchStore, Item, StoredFile
from app.config.schema import BatchConfig
from app.db.engine import DatabaseUnavailable
from app.errors import GatewayError, RateLimited, ServiceUnavailable, UpstreamRejected
from app.kinds import BatchStatus, DeferOutcome, ItemState, QueueClass
from app.pipeline.answer import JsonAnswer
from app.pipeline.core import Pipeline
from app.pipeline.request import CHAT, COMPLETIONS, EMBEDDINGS, Endpoint
from app.pipeline.wire import parse_call
from app.runtime import KeySpec

log = logging.getLogger("tokengate.batch")
_ENDPOINTS: dict[str, Endpoint] = {e.path: e for e in (CHAT, COMPLETIONS, EMBEDDINGS)}
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
        self.held: dict[str, dict[str, Any]] = {}  # batches held for a window, by id

    async def run(self) -> None:
        """The runner's loop (one task, owned by the gateway). The database going away
        pauses it (items in flight stay pending); it resumes when the database returns."""
        while True:
            try:
                for batch_id in await self.store.claim(self.owner, self.cfg.lease_sec):
                    await self._run_batch(batch_id)
            except DatabaseUnavailable:
                pass  # the database logs its outage once; /health/ready shows it
            except Exception:
                log.exception("batch runner pass failed; trying again")
            self.wake.clear()
            try:
                await asyncio.wait_for(self.wake.wait(), timeout=self.cfg.lease_sec / 3)
            except TimeoutError:
                pass

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
                return  # its items wait, pending, for the window (checked every pass)
            await self._run_items(batch, owner)
        self.held.pop(batch_id, None)
        await self._finalize(batch_id)

    async def _held(self, batch: dict[str, Any], owner: str) -> bool:
        """Whether the batch waits for its key's or `batch.defer_window` (deferral.py)."""
        settings = self.pipeline.runtime.settings
        key = self.key_of(owner)
        window = defer_window(settings, None if key is None else key.defer_window)
        if window is None and "tokengate_deferral" not in batch:
            return False
        cfg, now = self.cfg, time.time()
        pending = (await self.store.counts(batch["id"])).get(ItemState.PENDING, 0)
        decision = decide(
            self.pipeline.timetable,
            window,
            now,
            float(batch["expires_at"]),
            pending,
            cfg.item_estimate_sec,
            cfg.concurrency,
            cfg.defer_margin_sec,
        )
        if note(batch, decision, now):
            await self.store.save_batch(batch)
            outcome = DeferOutcome.EARLY_RELEASED if decision.early else DeferOutcome.RELEASED
            self.pipeline.metrics.record_deferred(DeferOutcome.HELD if decision.hold else outcome)
            if decision.early:
                log.warning(
                    "batch %s released early: it would miss its completion_window "
                    "waiting for window %r",
                    batch["id"],
                    window,
                )
        if decision.hold:
            self.held[batch["id"]] = {
                "batch": batch["id"],
                "pending": pending,
                **batch["tokengate_deferral"],
            }
        else:
            self.held.pop(batch["id"], None)
        return decision.hold

    async def _run_items(self, batch: dict[str, Any], owner: str) -> None:
        endpoint = _ENDPOINTS[batch["endpoint"]]
        gate = asyncio.Semaphore(self.cfg.concurrency)
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
                answer = await self.pipeline.handle(call)
            except (RateLimited, ServiceUnavailable) as busy:
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
    listing = "data" if endpoint is EMBEDDINGS else "choices"
    if not isinstance(body, dict) or not body.get(listing) or "usage" not in body:
        return ItemState.FAILED, item_error(
            item.custom_id, "invalid_output", f"the answer has no {listing} or no usage", response
        )
    return ItemState.DONE, {
        "id": new_id("batch_req_"),
        "custom_id": item.custom_id,
        "response": response,
        "error": None,
    }
