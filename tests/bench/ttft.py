"""Time to first token at concurrency 1, which wrk can not see.

One aiohttp connection, requests one after another: the clock runs from just
before the request is written to the arrival of the first `data:` line, and to the
end of the stream. The client's own cost is the same for every subject, so the
difference between a subject and the direct upstream is what the hop adds.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass

import aiohttp


@dataclass
class StreamTimes:
    ttft_ms: list[float]
    total_ms: list[float]
    failures: int

    def summary(self) -> dict[str, float | int]:
        return {
            "n": len(self.ttft_ms),
            "failures": self.failures,
            "ttft_p50_ms": round(_pct(self.ttft_ms, 50), 3),
            "ttft_p99_ms": round(_pct(self.ttft_ms, 99), 3),
            "total_p50_ms": round(_pct(self.total_ms, 50), 3),
            "total_p99_ms": round(_pct(self.total_ms, 99), 3),
        }


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


async def _one(session: aiohttp.ClientSession, url: str, body: bytes) -> tuple[float, float]:
    start = time.perf_counter()
    async with session.post(url, data=body) as resp:
        if resp.status != 200:
            await resp.read()
            raise RuntimeError(f"HTTP {resp.status}")
        first = None
        async for line in resp.content:
            if first is None and line.startswith(b"data:"):
                first = time.perf_counter()
        end = time.perf_counter()
    if first is None:
        raise RuntimeError("stream without a data: line")
    return (first - start) * 1000, (end - start) * 1000


async def _measure(
    url: str, body: bytes, headers: dict[str, str], n: int, warmup: int
) -> StreamTimes:
    times = StreamTimes([], [], 0)
    connector = aiohttp.TCPConnector(limit=1)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, headers=headers, timeout=timeout) as s:
        for i in range(warmup + n):
            try:
                ttft, total = await _one(s, url, body)
            except (TimeoutError, aiohttp.ClientError, RuntimeError):
                times.failures += 1
                continue
            if i >= warmup:
                times.ttft_ms.append(ttft)
                times.total_ms.append(total)
    return times


def measure(
    url: str, body: str, headers: dict[str, str], *, n: int, warmup: int = 5
) -> StreamTimes:
    return asyncio.run(_measure(url, body.encode(), headers, n, warmup))
