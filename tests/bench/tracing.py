"""Microbenchmark: what tracing costs the request pipeline, off and on.

`Pipeline.handle` for one non-streamed chat completion, in-process, against a transport
that answers at once from memory (so the figure is the gateway's own CPU: parse, plan,
admission, dispatcher slot, attempt, settle, metrics, access log), measured as CPU µs
per request over `N` sequential requests, best of `REPEATS` (a shared machine only ever
makes a run slower). Subjects, all in one run:

- `off`: the default (`tracing.enabled = false`): no tracer is built;
- `on, ratio 0`: tracing on, no request sampled (spans are created non-recording);
- `on, ratio 1`: every request traced, spans exported to a stub exporter that drops them
  (the batch processor's thread still runs; no network).

"Before" (the pipeline without the tracing seam) is the same script run from a checkout
of the older commit: `PYTHONPATH=<checkout> python -m tests.bench.tracing --only off`,
in the same session, so the two figures are measured alike.

Run alone: `.venv/bin/python -m tests.bench.tracing`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from app.config.schema import Settings
from app.gateway import Gateway
from app.metrics import Metrics, new_registry
from app.pipeline.request import CHAT
from app.pipeline.wire import parse_call
from app.runtime import KeySpec, compile_runtime

N, REPEATS = 3000, 5
KEY = KeySpec(alias="bench", digests=(), tokens_per_minute=10**12, requests_per_minute=10**10)
BODY = orjson.dumps(
    {"model": "m-1", "messages": [{"role": "user", "content": "ping"}], "max_tokens": 8}
)
ANSWER = orjson.dumps(
    {
        "id": "c",
        "object": "chat.completion",
        "model": "m-1",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "pong"}}],
        "usage": {"prompt_tokens": 4, "completion_tokens": 8},
    }
)


class _Answer:
    status = 200
    headers = {"content-type": "application/json"}  # noqa: RUF012
    complete = True

    async def read(self) -> bytes:
        return ANSWER

    def chunks(self) -> Any:
        raise NotImplementedError

    async def close(self) -> None:
        return None


class _Instant:
    """A transport answering every request at once, from memory."""

    async def request(self, *args: Any, **kwargs: Any) -> _Answer:
        return _Answer()

    async def close(self) -> None:
        return None


def _settings(home: Path, tracing: dict[str, Any] | None) -> Settings:
    data: dict[str, Any] = {
        "health_check": {"enabled": False},
        "database": {"path": str(home / "tokengate.sqlite3")},
        "scale_up": {"models": ["m-1"]},
    }
    if tracing is not None:
        data["tracing"] = tracing
    return Settings.model_validate(data)


def _silence_exporter(gateway: Gateway) -> None:
    """Replace the OTLP exporter's HTTP call with a drop (the span work stays)."""
    tracer: Any = getattr(gateway, "tracer", None)
    if tracer is None:
        return
    from opentelemetry.sdk.trace.export import SpanExportResult

    for processor in tracer.provider._active_span_processor._span_processors:
        exporter = processor._batch_processor._exporter
        exporter.export = lambda spans: SpanExportResult.SUCCESS


async def _measure(tracing: dict[str, Any] | None) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        runtime = compile_runtime(
            _settings(Path(tmp), tracing), {"TAOTOKEN_API_KEY": "sk-bench"}, no_auth=True
        )
        gateway = Gateway(
            runtime, Metrics(new_registry()), transport_factory=lambda spec: _Instant()
        )
        _silence_exporter(gateway)
        await gateway.start()
        pipeline = gateway.pipeline
        try:
            best = float("inf")
            for _ in range(REPEATS):
                started = time.process_time()
                for i in range(N):
                    call = parse_call(CHAT, BODY, KEY, f"req_{i}", {}, time.perf_counter())
                    await pipeline.handle(call)
                best = min(best, (time.process_time() - started) / N * 1e6)
            return best
        finally:
            await gateway.close()


SUBJECTS: dict[str, dict[str, Any] | None] = {
    "off": None,
    "on, ratio 0": {"enabled": True, "sample_ratio": 0.0},
    "on, ratio 1": {"enabled": True, "sample_ratio": 1.0},
}


def run(only: list[str] | None = None) -> dict[str, float]:
    logging.getLogger("tokengate").setLevel(logging.WARNING)  # no access log I/O measured
    return {
        name: asyncio.run(_measure(tracing))
        for name, tracing in SUBJECTS.items()
        if not only or name in only
    }


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m tests.bench.tracing")
    p.add_argument("--only", nargs="*", choices=list(SUBJECTS), help="subjects to run")
    results = run(p.parse_args().only)
    base = results.get("off")
    for name, us in results.items():
        ratio = f"  ({us / base:.3f} x off)" if base else ""
        print(f"{name:14s} {us:8.1f} us CPU/request{ratio}")


if __name__ == "__main__":
    main()
