"""Token usage reported by the upstream in a non-streaming answer.

Every answer must carry usage (the ledger depends on it). A 200 whose body is not a
JSON object is not an answer: it fails the attempt (`bad_response`), since each
sub-task's output is validated before it is billed (docs/design.md). It is ambiguous:
the upstream said 200, so it may have run (and billed) the request; it is sent again
only where `retry_policy.retry_unanswered` allows.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from app.upstream.attempt import AttemptFailed, Reason


@dataclass(frozen=True)
class Usage:
    prompt: int
    completion: int
    model: str | None
    reported: bool = True


def parse_usage(body: bytes, *, anthropic: bool = False) -> Usage:
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise _bad("answer is not JSON") from None
    if not isinstance(obj, dict):
        raise _bad("answer is not an object")
    usage = obj.get("usage")
    model = obj.get("model") if isinstance(obj.get("model"), str) else None
    if not isinstance(usage, dict):
        return Usage(0, 0, model, reported=False)
    if anthropic:
        return Usage(_int(usage.get("input_tokens")), _int(usage.get("output_tokens")), model)
    return Usage(_int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens")), model)


def _bad(detail: str) -> AttemptFailed:
    return AttemptFailed(Reason.BAD_RESPONSE, retryable=True, ambiguous=True, detail=detail)


def _int(value: object) -> int:
    return value if isinstance(value, int) and value >= 0 else 0
