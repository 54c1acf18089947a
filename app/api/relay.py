"""Responses for pipeline answers.

`SseResponse` drives a `StreamAnswer`: headers first, then each relayed event as
it arrives; whatever happens (client gone, error), the answer's `aclose` runs, so
its slot, ticket and upstream connection are always released.
"""

from __future__ import annotations

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from app.pipeline.answer import StreamAnswer
from app.pipeline.replies import JsonAnswer


async def send_json(answer: JsonAnswer, send: Send) -> None:
    """A JSON answer sent straight as the two ASGI messages: the edge routes' hot path skips
    building a Response object and its header normalisation."""
    headers = [
        (b"content-type", answer.content_type.encode("latin-1")),
        (b"content-length", str(len(answer.body)).encode()),
    ]
    headers += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in answer.headers.items()]
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": answer.body})


class SseResponse(Response):
    media_type = "text/event-stream"

    def __init__(self, answer: StreamAnswer) -> None:
        # Not Response.__init__: that would announce `content-length: 0`.
        self.status_code = answer.status
        self.background = None
        self.raw_headers = [
            *((k.encode("latin-1"), v.encode("latin-1")) for k, v in answer.headers.items()),
            (b"content-type", b"text/event-stream; charset=utf-8"),
        ]
        self.answer = answer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": self.status_code,
                    "headers": self.raw_headers,
                }
            )
            answer, more = self.answer, True
            async for chunk in answer.body():
                more = not answer.ending  # the last chunk carries the end of the answer
                await send({"type": "http.response.body", "body": chunk, "more_body": more})
            if more:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await self.answer.aclose()
