"""A real local HTTP receiver for webhooks: records every POST (headers, body), answers
200, or fails the next N posts with 500, or holds posts unanswered until released."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    headers: dict[str, str]
    raw: bytes

    @property
    def body(self) -> dict[str, Any]:
        return dict(json.loads(self.raw))


@dataclass
class Receiver:
    url: str
    posts: list[Received] = field(default_factory=list)
    fail_next: int = 0
    hold: threading.Event | None = None  # set: answer; unset: keep the request waiting
    lock: threading.Lock = field(default_factory=threading.Lock)

    def delivered(self) -> list[Received]:
        with self.lock:
            return list(self.posts)


@contextmanager
def receiver() -> Iterator[Receiver]:
    state: dict[str, Receiver] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            rec = state["r"]
            raw = self.rfile.read(int(self.headers.get("content-length", "0")))
            with rec.lock:
                rec.posts.append(Received({k.lower(): v for k, v in self.headers.items()}, raw))
                failing = rec.fail_next > 0
                rec.fail_next -= failing
            if rec.hold is not None:
                rec.hold.wait(60)
            self.send_response(500 if failing else 200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state["r"] = Receiver(f"http://127.0.0.1:{server.server_address[1]}/hook")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state["r"]
    finally:
        if state["r"].hold is not None:
            state["r"].hold.set()
        server.shutdown()
        server.server_close()
