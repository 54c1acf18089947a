"""The resend rule: a request goes out again (a retry, another domain, a fallback model)
only when the upstream cannot have acted on it, unless `retry_policy.retry_unanswered`
says so; every re-send is counted (`tokengate_upstream_resends_total`) and logged."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.support.loopback import Peer, Upstream, serve
from tests.unit.upstream.conformance.conftest import MakeThrough
from tests.unit.upstream.conformance.harness import MODEL, answer, head


@contextmanager
def refusing_port() -> Iterator[str]:
    """A base URL whose connects are refused (bound, never listening): nothing is sent."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{bound.getsockname()[1]}"


async def hang_up(peer: Peer) -> None:
    """Read the request, then close without a word: the upstream may have acted on it."""
    while await peer.request() is not None:
        peer.close()


def second_domain(how: str, first: str, second: str) -> dict[str, Any]:
    """Settings where `second` takes over from `first`: as another domain serving the
    same model, or as the domain of the fallback model."""
    if how == "another-domain":
        # routing by least expected wait (equal here: the configured order, d0 first),
        # not by the conversation's domain, so the dead one is always tried first
        return {"affinity": {"enabled": False}}
    return {
        "model_route": {"fallback": "m-2"},
        "scale_up": [
            {"domain": "d0", "api_base": first, "models": [MODEL]},
            {"domain": "d1", "api_base": second, "models": ["m-2"]},
        ],
    }


HOW = ["another-domain", "fallback-model"]


@pytest.mark.parametrize("how", HOW)
async def test_a_refused_connect_is_re_sent_and_counted(
    through: MakeThrough, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "tokengate.upstream")
    with refusing_port() as dead:
        async with Upstream(serve(answer())) as up:
            gw = await through(up, bases=[dead, up.url("")], **second_domain(how, dead, up.url("")))
            gw.upstreams = [up]
            r = await gw.chat()
            assert r.status_code == 200, r.text
            assert gw.sent(up) == 1
            # 3 attempts on the dead domain (2 retries), then 1 to the other: 3 re-sends
            assert await gw.metric("tokengate_upstream_resends_total", reason="connect") == 3
            assert await gw.metric("tokengate_upstream_resends_total", domain="d1") == 1
    rid = r.headers["x-request-id"]
    lines = [rec.getMessage() for rec in caplog.records if "re-sending" in rec.getMessage()]
    assert len(lines) == 3 and all(rid in line for line in lines), lines
    assert "sk-conformance-upstream" not in caplog.text


@pytest.mark.parametrize("how", HOW)
async def test_an_ambiguous_failure_is_not_re_sent_anywhere(through: MakeThrough, how: str) -> None:
    async with Upstream(hang_up) as first, Upstream(serve(answer())) as second:
        base = [first.url(""), second.url("")]
        gw = await through(first, second, bases=base, **second_domain(how, *base))
        r = await gw.chat()
        assert r.status_code == 502, r.text
        assert r.headers["x-should-retry"] == "false"
        assert "could bill it twice" in r.json()["error"]["message"]
        assert (gw.sent(first), gw.sent(second)) == (1, 0)
        assert await gw.metric("tokengate_upstream_resends_total") == 0


@pytest.mark.parametrize("how", HOW)
async def test_retry_unanswered_re_sends_an_ambiguous_failure_and_counts_it(
    through: MakeThrough, how: str
) -> None:
    async with Upstream(hang_up) as first, Upstream(serve(answer())) as second:
        base = [first.url(""), second.url("")]
        gw = await through(
            first,
            second,
            bases=base,
            retry_policy={"retry_unanswered": True},
            **second_domain(how, *base),
        )
        r = await gw.chat()
        assert r.status_code == 200, r.text
        assert (gw.sent(first), gw.sent(second)) == (3, 1)  # the availability it asked for
        assert await gw.metric("tokengate_upstream_resends_total", reason="reset") == 3


async def test_a_failing_status_the_upstream_sent_is_re_sent(through: MakeThrough) -> None:
    unavailable = (
        head("503 Service Unavailable", "content-type: application/json", "content-length: 2")
        + b"{}"
    )
    async with Upstream(serve(unavailable, unavailable, answer())) as up:
        gw = await through(up)
        r = await gw.chat()
        assert r.status_code == 200, r.text
        assert gw.sent(up) == 3
        assert await gw.metric("tokengate_upstream_resends_total", reason="status_503") == 2


@pytest.mark.parametrize("mode", ["cooperate", "client"])
async def test_a_held_back_request_tells_sdks_not_to_retry_either(
    through: MakeThrough, mode: str
) -> None:
    async with Upstream(hang_up) as up:
        gw = await through(up, retry_policy={"client_retries": mode})
        r = await gw.chat()
        assert r.status_code == 502
        assert r.headers["x-should-retry"] == "false"  # an SDK retry would bill twice too
        assert gw.sent(up) == 1
