"""The last error answers, for the status page: a bounded list, newest first.

Each entry is what an operator needs to find the request in the access log (its id,
key alias, model, domain, status, error code) and the message the client was sent,
shortened. Nothing else is kept: never a prompt, an upstream body or a header, so
nothing here can leak what the log's redaction would have caught. The message is a
`GatewayError`'s own (written in `app/errors.py` to be shown to clients); any other
exception is shown by its type only.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

MAX_MESSAGE = 200


class RecentFailure(NamedTuple):
    """One error answer, as the pipeline knows it when the request ends."""

    request_id: str
    key: str
    model: str | None
    domain: str | None
    status: int
    code: str | None
    message: str


def shorten(message: str, limit: int = MAX_MESSAGE) -> str:
    flat = " ".join(message.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


class RecentErrors:
    def __init__(self, size: int = 50, wall: Callable[[], float] = time.time) -> None:
        self._entries: deque[tuple[float, RecentFailure]] = deque(maxlen=size)
        self.wall = wall
        self.total = 0  # since start, so the page can tell "50 shown of 1234"

    def add(self, failure: RecentFailure) -> None:
        self.total += 1
        short = failure._replace(message=shorten(failure.message))
        self._entries.append((round(self.wall(), 3), short))

    def snapshot(self) -> dict[str, object]:
        return {
            "total": self.total,
            "recent": [{"at": at, **f._asdict()} for at, f in reversed(self._entries)],
        }
