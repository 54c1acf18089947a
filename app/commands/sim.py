"""Flags of `tokengate sim` and its runner."""

from __future__ import annotations

import argparse
import os

from app.sim.knobs import Faults, SimKnobs


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9090)
    p.add_argument(
        "--models",
        default="claude-sonnet,gpt-4o,text-embedding-3-small",
        help="comma-separated model ids it serves",
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("TOKENGATE_SIM_API_KEY"),
        help="the only key it accepts (default $TOKENGATE_SIM_API_KEY; unset = any)",
    )
    p.add_argument("--latency-ms", type=float, default=0.0, help="delay before the first byte")
    p.add_argument("--tokens-per-sec", type=float, default=0.0, help="generation speed (0 = max)")
    p.add_argument("--reply-tokens", type=int, default=16, help="completion length")
    p.add_argument("--rpm", type=int, help="its own requests/min quota (429 past it)")
    p.add_argument("--tpm", type=int, help="its own tokens/min quota (429 past it)")
    p.add_argument(
        "--quota-window-sec",
        type=float,
        default=60.0,
        help="burst window of the quota (shorter = smaller burst)",
    )
    p.add_argument(
        "--quota-mode",
        choices=["bucket", "window"],
        default="bucket",
        help="bucket: refills continuously; window: counts per fixed window of "
        "--quota-window-sec (how providers quantize per-minute quotas)",
    )
    p.add_argument(
        "--quota-headers",
        choices=["full", "retry-after", "none"],
        default="full",
        help="full: x-ratelimit-* on every answer and Retry-After on 429s; "
        "retry-after: only the latter; none: bare 429s",
    )
    p.add_argument(
        "--balance",
        type=int,
        help="prepaid tokens; once spent, 429 insufficient_quota (top up: PUT /_sim/quota)",
    )
    p.add_argument("--fail-status", type=int, default=500, help="status of injected failures")
    p.add_argument("--fail-rate", type=float, default=0.0, help="probability of a failure")
    p.add_argument("--fail-next", type=int, default=0, help="fail the next N requests")
    p.add_argument("--fail-retry-after", type=float, help="Retry-After sent with failures")
    p.add_argument("--stall-ms", type=float, default=0.0, help="stall every request this long")
    p.add_argument("--drop-after", type=int, help="break streams off after N content chunks")
    p.add_argument("--no-record", action="store_true", help="do not keep request records")
    p.add_argument(
        "--cache-entries",
        type=int,
        default=50_000,
        help="prompt-cache prefixes it remembers (LRU; 0 = no prompt cache)",
    )
    p.add_argument(
        "--cache-min-tokens",
        type=int,
        default=1024,
        help="shortest prompt prefix it caches, in its own tokens (as the real APIs: 1024)",
    )
    p.add_argument(
        "--tool-calls",
        choices=("auto", "named"),
        default="auto",
        help="answer every request that offers tools with a tool call (auto), or only when "
        "tool_choice demands one or the prompt names a tool (named: for agents that send "
        "their whole tool set on every turn)",
    )
    p.add_argument(
        "--background-ms",
        type=float,
        default=300.0,
        help="how long a Responses API background response takes (queued, then in progress)",
    )
    p.add_argument(
        "--responses-websocket",
        action="store_true",
        help="also serve the Responses API's WebSocket mode on GET /v1/responses",
    )
    p.add_argument(
        "--betas",
        help="comma-separated anthropic-beta values (globs) it knows: any other is refused "
        "with 400, as strict upstreams (Vertex, Bedrock) do (default: any is accepted)",
    )


def knobs_from(args: argparse.Namespace) -> SimKnobs:
    return SimKnobs(
        models=tuple(m.strip() for m in args.models.split(",") if m.strip()),
        api_key=args.api_key or None,
        latency_ms=args.latency_ms,
        tokens_per_sec=args.tokens_per_sec,
        reply_tokens=args.reply_tokens,
        rpm=args.rpm,
        tpm=args.tpm,
        quota_window_sec=args.quota_window_sec,
        quota_mode=args.quota_mode,
        quota_headers=args.quota_headers,
        balance=args.balance,
        record=not args.no_record,
        cache_entries=args.cache_entries,
        cache_min_tokens=args.cache_min_tokens,
        tool_calls=args.tool_calls,
        background_ms=args.background_ms,
        responses_websocket=args.responses_websocket,
        betas=None if args.betas is None else tuple(b for b in args.betas.split(",") if b),
        faults=Faults(
            status=args.fail_status,
            count=args.fail_next,
            rate=args.fail_rate,
            retry_after=args.fail_retry_after,
            stall_ms=args.stall_ms,
            drop_after=args.drop_after,
        ),
    )


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from app.sim.simulator import create_sim_app

    app = create_sim_app(knobs_from(args))
    print(
        f"tokengate sim: OpenAI-compatible upstream on http://{args.host}:{args.port}/v1",
        flush=True,
    )
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
        # A stand-in upstream need not drain: a stalled or held answer (the `stall_ms` and
        # `hold` faults) kept it from exiting on SIGTERM for as long as the stall lasted.
        timeout_graceful_shutdown=1,
    )
    return 0
