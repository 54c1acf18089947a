"""The files and batches API as OpenAI defines it, minus HTTP.

A batch is validated when it is created: every line of the input file becomes an item,
either `pending` or, if the line is unusable (not JSON, no `custom_id`, another URL
than the batch's endpoint, a streaming body), `failed` with an error that names the line,
so a bad line is reported and the rest runs. Whole-batch problems (unknown file, duplicate
`custom_id`, too many lines) are refused at once with a 400: a batch is never created
that could get stuck. Batches and files are visible to the key that created them only.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import orjson

from app.batch.store import BATCH_PREFIX, BatchStore, StoredFile
from app.config.schema import BatchConfig
from app.errors import InvalidRequest, NotFound, PayloadTooLarge
from app.kinds import RUNNING_BATCH, BatchStatus, ItemState

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
WINDOW_SEC = 24 * 3600
ItemRow = tuple[str, dict[str, Any], str, dict[str, Any] | None]


def new_id(prefix: str) -> str:
    return f"{prefix}{os.urandom(12).hex()}"


def item_error(
    custom_id: str | None, code: str, message: str, response: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "id": new_id("batch_req_"),
        "custom_id": custom_id,
        "response": response,
        "error": {"code": code, "message": message},
    }


class BatchService:
    def __init__(self, store: BatchStore, cfg: BatchConfig, wake: Callable[[], None]) -> None:
        self.store = store
        self.cfg = cfg
        self.wake = wake

    # -- files -----------------------------------------------------------------------
    async def upload(self, owner: str, filename: str, purpose: str, content: bytes) -> StoredFile:
        if purpose != "batch":
            raise InvalidRequest(
                f"purpose '{purpose}' is not supported: use 'batch'", param="purpose"
            )
        if len(content) > self.cfg.max_file_bytes:
            raise PayloadTooLarge(f"file exceeds batch.max_file_bytes ({self.cfg.max_file_bytes})")
        try:
            content.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidRequest("the file is not UTF-8 JSONL", param="file") from None
        f = StoredFile(
            new_id("file-"),
            owner,
            purpose,
            filename or "input.jsonl",
            len(content),
            int(time.time()),
        )
        await self.store.add_file(f, content)
        return f

    async def file(self, owner: str, file_id: str) -> StoredFile:
        f = await self.store.get_file(file_id)
        if f is None or f.owner != owner:
            raise NotFound(f"No such File object: {file_id}", param="file_id")
        return f

    async def content(self, owner: str, file_id: str) -> bytes:
        await self.file(owner, file_id)
        return await self.store.file_content(file_id)

    # -- batches ---------------------------------------------------------------------------
    async def create(
        self,
        owner: str,
        input_file_id: str,
        endpoint: str,
        window: str,
        metadata: dict[str, str] | None,
    ) -> dict[str, Any]:
        if endpoint not in ENDPOINTS:
            raise InvalidRequest(
                f"endpoint must be one of {', '.join(ENDPOINTS)}", param="endpoint"
            )
        if window != "24h":
            raise InvalidRequest("completion_window must be '24h'", param="completion_window")
        source = await self.file(owner, input_file_id)
        if source.purpose != "batch":
            raise InvalidRequest("the input file's purpose must be 'batch'", param="input_file_id")
        items, errors = self._items(await self.store.file_content(input_file_id), endpoint)
        now = int(time.time())
        failed = sum(1 for _, _, state, _ in items if state == ItemState.FAILED)
        batch: dict[str, Any] = {
            "id": new_id(BATCH_PREFIX),
            "object": "batch",
            "endpoint": endpoint,
            "errors": {"object": "list", "data": errors} if errors else None,
            "input_file_id": input_file_id,
            "completion_window": window,
            "status": BatchStatus.IN_PROGRESS,
            "output_file_id": None,
            "error_file_id": None,
            "created_at": now,
            "in_progress_at": now,
            "expires_at": now + WINDOW_SEC,
            "finalizing_at": None,
            "completed_at": None,
            "failed_at": None,
            "expired_at": None,
            "cancelling_at": None,
            "cancelled_at": None,
            "request_counts": {"total": len(items), "completed": 0, "failed": failed},
            "metadata": metadata,
        }
        await self.store.add_batch(batch, owner, items)
        self.wake()
        return batch

    def _items(self, content: bytes, endpoint: str) -> tuple[list[ItemRow], list[dict[str, Any]]]:
        items: list[ItemRow] = []
        errors: list[dict[str, Any]] = []
        seen: dict[str, int] = {}
        for number, line in enumerate(content.splitlines(), start=1):
            if not line.strip():
                continue
            custom_id, request, problem = _parse_line(line, endpoint)
            if custom_id is not None:
                if custom_id in seen:
                    raise InvalidRequest(
                        f"duplicate custom_id '{custom_id}' on lines {seen[custom_id]} and "
                        f"{number}: each request needs its own",
                        param="input_file_id",
                    )
                seen[custom_id] = number
            if problem is not None:
                code, message = problem
                errors.append({"code": code, "line": number, "message": message, "param": None})
                items.append(
                    (
                        custom_id or "",
                        {},
                        ItemState.FAILED,
                        item_error(custom_id, code, f"line {number}: {message}"),
                    )
                )
            else:
                items.append((custom_id or "", request, ItemState.PENDING, None))
            if len(items) > self.cfg.max_items:
                raise InvalidRequest(
                    f"more than batch.max_items ({self.cfg.max_items}) requests",
                    param="input_file_id",
                )
        return items, errors

    async def get(self, owner: str, batch_id: str) -> dict[str, Any]:
        found = await self.store.get_batch(batch_id)
        if found is None or found[0] != owner or not batch_id.startswith(BATCH_PREFIX):
            raise NotFound(f"No such Batch object: {batch_id}", param="batch_id")
        batch = found[1]
        if batch["status"] in RUNNING_BATCH:
            counts = await self.store.counts(batch_id)
            batch["request_counts"] = request_counts(counts)
        return batch

    async def list(self, owner: str, after: str | None, limit: int) -> dict[str, Any]:
        limit = max(1, min(limit, 100))
        data = await self.store.list_batches(owner, after, limit + 1)
        page = data[:limit]
        return {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(data) > limit,
        }

    async def cancel(self, owner: str, batch_id: str) -> dict[str, Any]:
        batch = await self.get(owner, batch_id)
        if batch["status"] == BatchStatus.IN_PROGRESS:
            batch["status"], batch["cancelling_at"] = BatchStatus.CANCELLING, int(time.time())
            await self.store.save_batch(batch)
            self.wake()
        return batch


def request_counts(counts: dict[str, int]) -> dict[str, int]:
    """OpenAI's `request_counts` from item states (pending ones are in `total` only)."""
    return {
        "total": sum(counts.values()),
        "completed": counts.get(ItemState.DONE, 0),
        "failed": counts.get(ItemState.FAILED, 0),
    }


def _parse_line(
    line: bytes, endpoint: str
) -> tuple[str | None, dict[str, Any], tuple[str, str] | None]:
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        return None, {}, ("invalid_json", f"not valid JSON ({exc.msg})")
    if not isinstance(obj, dict):
        return None, {}, ("invalid_json", "a line must be a JSON object")
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return None, {}, ("missing_custom_id", "'custom_id' must be a non-empty string")
    if obj.get("method", "POST") != "POST":
        return custom_id, {}, ("invalid_method", "'method' must be POST")
    if obj.get("url") != endpoint:
        return custom_id, {}, ("invalid_url", f"'url' must be this batch's endpoint {endpoint}")
    body = obj.get("body")
    if not isinstance(body, dict):
        return custom_id, {}, ("invalid_body", "'body' must be a JSON object")
    if body.get("stream") is True:
        return custom_id, {}, ("stream_not_supported", "batch requests can not stream")
    return custom_id, body, None
