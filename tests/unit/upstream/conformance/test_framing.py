"""How an answer is framed, and answers that are not HTTP a gateway may relay."""

from __future__ import annotations

import gzip
import logging

import pytest

from tests.support.loopback import Peer, Upstream, chunked, serve
from tests.unit.upstream.conformance.conftest import MakeThrough
from tests.unit.upstream.conformance.harness import ANSWER, answer, head


def closing(script: bytes) -> object:
    """Answer the first request with `script`, then close the connection."""

    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(script)
        peer.close()

    return handler


OK_FRAMINGS = {
    "content-length": serve(answer()),
    "chunked": serve(
        head("200 OK", "content-type: application/json", "transfer-encoding: chunked")
        + chunked(ANSWER[:10], ANSWER[10:])
        + b"0\r\n\r\n"
    ),
    "chunk-extensions-and-trailers": serve(
        head(
            "200 OK", "content-type: application/json", "transfer-encoding: chunked", "trailer: x-t"
        )
        + b'%x;name=value;quoted="a b"\r\n%s\r\n' % (len(ANSWER), ANSWER)
        + b"0;last\r\nx-t: done\r\n\r\n"
    ),
    "close-delimited": closing(head("200 OK", "content-type: application/json") + ANSWER),
    "interim-100-and-103": serve(
        head("100 Continue") + head("103 Early Hints", "link: </x>; rel=preload") + answer()
    ),
    "content-encoding-gzip": serve(
        answer(gzip.compress(ANSWER), "content-encoding: gzip")  # despite identity asked for
    ),
}


@pytest.mark.parametrize("script", OK_FRAMINGS.values(), ids=OK_FRAMINGS.keys())
async def test_a_well_framed_answer_reaches_the_client_whole(
    through: MakeThrough, script: object
) -> None:
    async with Upstream(script) as up:  # type: ignore[arg-type]
        gw = await through(up)
        for _ in range(2):  # and the connection (or a new one) serves the next request
            r = await gw.chat()
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"] == "pong"
            assert r.json()["usage"]["total_tokens"] == 7
        assert gw.sent(up) == 2
        assert "content-encoding" not in r.headers  # the client gets what was decoded


BAD_HEADS = {
    # RFC 9112 §6.3: a response with both is a smuggling vector; aiohttp's parser refuses it
    "content-length-and-chunked": head("200 OK", "content-length: 5", "transfer-encoding: chunked")
    + chunked(b"ok")
    + b"0\r\n\r\n",
    "duplicate-content-length": head("200 OK", "content-length: 2", "content-length: 2") + b"ok",
    "conflicting-content-length": head("200 OK", "content-length: 2", "content-length: 3") + b"ok!",
    "content-length-list": head("200 OK", "content-length: 2, 2") + b"ok",
    "bad-status-line": b"HTTP/1.1 2000 OK\r\ncontent-length: 2\r\n\r\nok",
    "too-many-header-fields": head(
        "200 OK", *(f"x-f{n}: v" for n in range(5000)), "content-length: 2"
    )
    + b"ok",
    "a-huge-header-field": head("200 OK", "x-huge: " + "v" * (1 << 20), "content-length: 2")
    + b"ok",
    # a transfer coding nobody here decodes: before, a reset (gzip then close) and a
    # wait for the whole read timeout (chunked, gzip on an open socket)
    "transfer-encoding-gzip": head("200 OK", "transfer-encoding: gzip") + gzip.compress(ANSWER),
    "transfer-encoding-chunked-gzip": head("200 OK", "transfer-encoding: chunked, gzip"),
    "content-encoding-unknown": head("200 OK", "content-encoding: compress", "content-length: 2")
    + b"ok",
    "101-switching-protocols": head(
        "101 Switching Protocols", "connection: upgrade", "upgrade: websocket"
    )
    + b"\x81\x05hello",
}


# Framed soundly (the connection may carry the next exchange), only not decodable.
SOUND_FRAMING = {"content-encoding-unknown"}


@pytest.mark.parametrize("case", BAD_HEADS)
async def test_an_answer_no_gateway_may_relay_is_a_prompt_502_sent_once(
    through: MakeThrough, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    script = BAD_HEADS[case]

    async def handler(peer: Peer) -> None:
        if peer.index == 0:
            await peer.request()
            await peer.send(script)  # and keep the connection open: no close to lean on
        await serve(answer())(peer)  # were this connection reused, the next would work

    caplog.set_level(logging.WARNING)
    async with Upstream(handler) as up:
        # A read timeout far beyond the test's patience: only a prompt verdict passes.
        gw = await through(up, token_scheduler={"timeout_ms": 30000})
        r = await gw.chat()
        assert r.status_code == 502, r.text
        assert r.json()["error"]["code"] == "upstream_error"
        assert r.headers["x-should-retry"] == "false"
        assert gw.sent(up) == 1  # not sent again: the upstream may have acted on it
        # a connection whose framing is suspect is never reused; the next request works
        ok = await gw.chat()
        assert ok.status_code == 200, ok.text
        assert gw.sent(up) == 2
        assert len(up.peers) == (1 if case in SOUND_FRAMING else 2)
    # no traceback, no "Fatal error on transport" from asyncio
    assert not [r for r in caplog.records if r.exc_info or "fatal" in r.getMessage().lower()]
