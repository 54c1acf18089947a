"""The simulator's refusals, raised by the answer shapes and the server alike.

Its own module so `shapes` (which validates bodies) and `simulator` (which renders the
refusal as the real API would) need not import each other.
"""

from __future__ import annotations


class SimError(Exception):
    """An HTTP refusal as the real upstream sends it: status, OpenAI `type` (`kind`) and
    `code`, and headers such as `Retry-After` on a quota 429."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.code = status, message, kind, code
        self.headers = headers or {}
