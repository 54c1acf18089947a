"""Token usage reported by the upstream in a non-streaming answer.

Every answer must carry usage (the ledger depends on it). A 200 whose body is not a
JSON object is not an answer: it fails the attempt (`bad_response`), since each
sub-task's output is validated before it is billed (docs/design.md). It is ambiguous:
the upstream said 200, so it may have run (and billed) the request; it is sent again
only where `retry_policy.retry_unanswered` allows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from app.upstream.attempt import AttemptFailed, Reason


@dataclass(frozen=True)
class Usage:
    prompt: int
    completion: int
    model: str | None
    reported: bool = True
    cached: int = 0  # prompt tokens served from the upstream's prompt cache


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
        prompt, completion = usage.get("input_tokens"), usage.get("output_tokens")
    else:
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return Usage(_int(prompt), _int(completion), model, cached=cached_tokens(usage))


def cached_tokens(usage: dict[str, Any]) -> int:
    """Prompt tokens read from the upstream's cache: OpenAI's
    `prompt_tokens_details.cached_tokens` (part of `prompt_tokens`) or Anthropic's
    `cache_read_input_tokens` (which Anthropic counts apart from `input_tokens`)."""
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and "cached_tokens" in details:
        return _int(details["cached_tokens"])
    return _int(usage.get("cache_read_input_tokens"))


def _bad(detail: str) -> AttemptFailed:
    return AttemptFailed(Reason.BAD_RESPONSE, retryable=True, ambiguous=True, detail=detail)


def _int(value: object) -> int:
    return value if isinstance(value, int) and value >= 0 else 0
