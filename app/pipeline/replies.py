"""The records a JSON answer passes through: the upstream's reply, and what a route sends.

They live apart from `answer.py`, which stays interpreted (its streams are async
generators), so that the compiled build runs their `__init__` as C: one of each is built
per request, and a dataclass's generated `__init__` or a NamedTuple's constructor stays
Python in the compiled build (deploy/BENCHMARKS.md, issue #32's sixth pass).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from app.upstream.answer_usage import Usage
from app.upstream.transport import UpstreamResponse


@dataclass(slots=True, init=False)
class Reply:
    """An upstream's answer as an attempt hands it on: its head, its first bytes, the rest
    of a stream (None: the whole body is `first`), and the usage of a whole body."""

    response: UpstreamResponse
    first: bytes
    rest: AsyncIterator[bytes] | None
    usage: Usage | None

    def __init__(
        self,
        response: UpstreamResponse,
        first: bytes,
        rest: AsyncIterator[bytes] | None,
        usage: Usage | None,
    ) -> None:
        self.response = response
        self.first = first
        self.rest = rest
        self.usage = usage


@dataclass(slots=True, init=False)
class JsonAnswer:
    """A whole answer for a route to send: status, body, content type, headers."""

    status: int
    body: bytes
    content_type: str
    headers: dict[str, str]

    def __init__(
        self, status: int, body: bytes, content_type: str, headers: dict[str, str]
    ) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers
