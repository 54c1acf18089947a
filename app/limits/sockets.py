"""Open Responses WebSocket connections per key, in this process: a key holds at most its
cap (`max_websockets`, else `server.max_websockets_per_key`), so one tenant can not pin
the gateway's connections, tasks and conversation memory by opening sockets."""

from __future__ import annotations


class SocketCounts:
    def __init__(self) -> None:
        self._open: dict[str, int] = {}

    def take(self, alias: str, cap: int) -> bool:
        """One more connection for `alias`, if it holds fewer than `cap`."""
        held = self._open.get(alias, 0)
        if held >= cap:
            return False
        self._open[alias] = held + 1
        return True

    def give_back(self, alias: str) -> None:
        held = self._open.get(alias, 0) - 1
        if held > 0:
            self._open[alias] = held
        else:
            self._open.pop(alias, None)

    def held(self, alias: str) -> int:
        return self._open.get(alias, 0)
