"""What the pipeline hands back to a route: a JSON body (`app.pipeline.replies`), or a
stream that settles itself (`app.pipeline.stream_answer`).

This module keeps what the compiled build cannot compile: `frames`, the frame mode of a
client's Responses WebSocket, one event's JSON per item, is an async generator. An
upstream socket's frames pass through it as they came, each read directly for usage, the
first token and the end of the response (`FrameReader`), with no SSE on the way; an HTTP
upstream's SSE events are cut by the relay and handed on by their data. It ends as
`StreamAnswer.body` does: the request is settled before its last frames go out, and a
response cut before its terminal event ends with `response.failed`, charged what was
streamed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from app.pipeline.replies import JsonAnswer
from app.pipeline.stream_answer import StreamAnswer
from app.upstream.attempt import AttemptFailed
from app.upstream.sse import event_payloads
from app.upstream.streaming import FrameReader
from app.upstream.websocket import SocketAnswer

__all__ = ["Answer", "StreamAnswer", "frames"]


async def frames(answer: StreamAnswer) -> AsyncIterator[bytes]:
    """The answer for a client's WebSocket, one event's JSON per item (frame mode):
    an upstream socket's frames as they came, an HTTP upstream's SSE events by their
    data. Frames that arrive with the end of the response wait until the request is
    settled; a response cut before its terminal event ends with `response.failed`."""
    response = answer._reply.response
    reader = FrameReader() if isinstance(response, SocketAnswer) else None
    if reader is not None:
        answer.relay = reader
    relay, status, outcome = answer.relay, 200, None
    held: list[bytes] = []
    try:
        try:
            chunk: bytes | None = answer._reply.first
            assert answer._reply.rest is not None
            while chunk is not None:
                if reader is not None:
                    reader.see(chunk)
                    events = [chunk]
                else:
                    events = event_payloads(relay.feed(chunk))
                if answer._tell is not None:
                    await answer._told()
                if response.complete:
                    held += events
                elif events:
                    answer._ttft()
                    for event in events:
                        yield event
                chunk = await anext(answer._reply.rest, None)
            held += event_payloads(relay.finish())
            if not relay.done and not relay.has_usage:
                outcome = "truncated"
                held.append(answer._failed_frame("the upstream closed the stream early"))
        except AttemptFailed as failure:
            outcome = failure.reason
            held.append(answer._failed_frame(f"the upstream stream broke off ({failure.reason})"))
        await answer._ended(outcome)
        for event in held:
            yield event
    except BaseException:
        status, outcome = 499, "client_closed"
        raise
    finally:
        await answer._close(status if outcome in (None, "client_closed") else 502, outcome)


Answer = JsonAnswer | StreamAnswer
