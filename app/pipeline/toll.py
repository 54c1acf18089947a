"""Admission for the routes that reach an upstream without generating anything.

`POST /v1/messages/count_tokens`, `POST /v1/responses/input_tokens`, and the routes that
follow a stored response (`GET`/`DELETE /v1/responses/{id}`, `/cancel`, `/input_items`)
each cost the upstream a request, so each goes through the key's admission like a
generation does: a key refused on chat (429) is refused on these too, before any
upstream is asked.

    admit(key, tokens)   1 request + `tokens` from the key's buckets (and its budgets'
                         holds): the prompt estimate for a count, which a chat with that
                         prompt would reserve too; 0 for following a stored response
    settle(ticket, ...)  the request stays charged, the tokens go back (counting and
                         reading generate nothing, and upstreams do not bill them); one
                         ledger row (0 tokens) per request, so `/admin/usage` counts them
"""

from __future__ import annotations

from app.billing.ledger import UsageEntry
from app.limits.admission import Admission, Ticket
from app.runtime import KeySpec


class Toll:
    def __init__(self, admission: Admission) -> None:
        self.admission = admission

    async def admit(self, key: KeySpec, tokens: int) -> Ticket:
        return await self.admission.admit(key, tokens)

    def settle(
        self, ticket: Ticket, key: KeySpec, model: str | None, domain: str, status: int
    ) -> UsageEntry:
        entry = UsageEntry(
            key=key.alias,
            model=model or "-",
            error=status != 200,
            domain=domain,
            status=status,
            team=key.team or "-",
        )
        self.admission.settle(ticket, entry, dispatched=True)
        return entry
