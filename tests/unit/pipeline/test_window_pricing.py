"""A request is priced by the billing window in force when the upstream finished serving
it, not when it arrived: the wall clock crosses a window's start while the upstream has it."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import httpx

from app.db.usage import UsageQuery
from app.pipeline.replies import JsonAnswer
from app.pipeline.request import CHAT
from app.pipeline.wire import parse_call
from tests.support.inproc import CHAT_OK, MakeGateway, ledger_rows

SETTINGS = {
    "model_route": {"default": "m-1"},
    "scale_up": {"models": ["m-1"]},
    "billing": {
        "windows": {"offpeak": {"start": "16:30", "end": "00:30"}},
        "prices": {"m-1": {"input": 2, "output": 10, "windows": {"offpeak": {"input": 1}}}},
    },
}
BEFORE = datetime(2026, 12, 5, 16, 29, 59, tzinfo=UTC).timestamp()


async def test_a_request_the_upstream_finishes_after_the_window_opens_is_priced_in_it(
    make_local_gateway: MakeGateway,
) -> None:
    now = [BEFORE]

    def upstream(request: httpx.Request) -> httpx.Response:
        now[0] += 2  # the upstream answers at 16:30:01: in the window
        return httpx.Response(200, json=CHAT_OK)

    gw = make_local_gateway(SETTINGS, handler=upstream)
    gw.pipeline.pricing.wall_clock = lambda: now[0]
    await gw.start()
    body = json.dumps({"messages": [{"role": "user", "content": "x"}]}).encode()
    call = parse_call(CHAT, body, gw.keys.anonymous, "req_w", {}, time.perf_counter())
    answer = await gw.pipeline.handle(call)
    assert isinstance(answer, JsonAnswer)
    # 3 prompt tokens at the window's input (1), 1 completion token at the base output (10)
    assert answer.headers["x-tokengate-cost"] == "0.000013 USD"
    now[0] = BEFORE - 3600  # and one served before the window: the base input price (2)
    answer = await gw.pipeline.handle(
        parse_call(CHAT, body, gw.keys.anonymous, "req_x", {}, time.perf_counter())
    )
    assert isinstance(answer, JsonAnswer)
    assert answer.headers["x-tokengate-cost"] == "0.000016 USD"
    await gw.ledger.flush()
    rows = await ledger_rows(gw)
    assert sorted((r["model"], r["requests"]) for r in rows) == [("m-1", 2)]
    windows = await gw.ledger.report(UsageQuery(group_by=("window",)))
    assert sorted((r["window"], r["cost_nanos"]) for r in windows) == [
        ("-", 16_000),
        ("offpeak", 13_000),
    ]
