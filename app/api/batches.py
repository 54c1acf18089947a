"""OpenAI's files and batches routes, so `client.files` and `client.batches` work unchanged."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, File, Form, Query, UploadFile
from pydantic import BaseModel, ConfigDict
from starlette.responses import Response

from app.api.deps import CallerDep, GatewayDep
from app.errors import PayloadTooLarge

router = APIRouter(prefix="/v1")
_CHUNK = 1 << 20


@router.post("/files")
async def create_file(
    gateway: GatewayDep,
    caller: CallerDep,
    file: Annotated[UploadFile, File()],
    purpose: Annotated[str, Form()],
) -> dict[str, Any]:
    limit = gateway.runtime.settings.batch.max_file_bytes
    chunks, size = [], 0
    while chunk := await file.read(_CHUNK):
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"file exceeds batch.max_file_bytes ({limit} bytes)")
        chunks.append(chunk)
    stored = await gateway.batches.upload(
        caller.alias, file.filename or "", purpose, b"".join(chunks)
    )
    return stored.as_openai()


@router.get("/files/{file_id}")
async def get_file(file_id: str, gateway: GatewayDep, caller: CallerDep) -> dict[str, Any]:
    return (await gateway.batches.file(caller.alias, file_id)).as_openai()


@router.get("/files/{file_id}/content")
async def file_content(file_id: str, gateway: GatewayDep, caller: CallerDep) -> Response:
    content = await gateway.batches.content(caller.alias, file_id)
    return Response(content, media_type="application/jsonl")


class BatchCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    input_file_id: str
    endpoint: str
    completion_window: Literal["24h"]
    metadata: dict[str, str] | None = None


@router.post("/batches")
async def create_batch(body: BatchCreate, gateway: GatewayDep, caller: CallerDep) -> dict[str, Any]:
    return await gateway.batches.create(
        caller.alias, body.input_file_id, body.endpoint, body.completion_window, body.metadata
    )


@router.get("/batches/{batch_id}")
async def get_batch(batch_id: str, gateway: GatewayDep, caller: CallerDep) -> dict[str, Any]:
    return await gateway.batches.get(caller.alias, batch_id)


@router.get("/batches")
async def list_batches(
    gateway: GatewayDep,
    caller: CallerDep,
    after: Annotated[str | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> dict[str, Any]:
    return await gateway.batches.list(caller.alias, after, limit)


@router.post("/batches/{batch_id}/cancel")
async def cancel_batch(batch_id: str, gateway: GatewayDep, caller: CallerDep) -> dict[str, Any]:
    return await gateway.batches.cancel(caller.alias, batch_id)
