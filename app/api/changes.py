"""`GET /admin/audit`: the audit trail, newest first, with filters.

since, until   ISO 8601 (UTC if no zone; a bare date is its midnight in
               `billing.timezone`) or epoch seconds; `until` exclusive
actor          `admin` (an admin credential's name), `reload`, `expiry`
action         exact (`key_limits.set`) or a prefix ending in "." (`key.`)
target         `key:alice`, `team:search`, `model:gpt-4o`, `window:night`, ...
limit          newest rows first, 1..1000 (100)
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from app.api.admin import AdminDep, parse_instant
from app.db.engine import DatabaseUnavailable
from app.db.trail import MAX_ROWS, AuditQuery
from app.errors import ServiceUnavailable

router = APIRouter(prefix="/admin")


@router.get("/audit")
async def audit(
    gateway: AdminDep,
    since: Annotated[str | None, Query()] = None,
    until: Annotated[str | None, Query()] = None,
    actor: Annotated[str | None, Query(max_length=128)] = None,
    action: Annotated[str | None, Query(max_length=64)] = None,
    target: Annotated[str | None, Query(max_length=256)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_ROWS)] = 100,
) -> dict[str, object]:
    query = AuditQuery(
        since=parse_instant(since, "since", gateway.calendar),
        until=parse_instant(until, "until", gateway.calendar),
        actor=actor,
        action=action,
        target=target,
        limit=limit,
    )
    try:
        rows = await gateway.audit.read(query)
    except DatabaseUnavailable:
        raise ServiceUnavailable(
            "the audit trail's database is unreachable; changes are kept and written when "
            "it returns",
            code="database_unavailable",
            retry_after=5.0,
        ) from None
    for row in rows:
        row["at"] = gateway.calendar.describe(row["at"])
    return {"object": "list", "timezone": gateway.calendar.timezone, "data": rows}
