"""Token usage reported by the upstream in a non-streaming answer.

Every answer must carry usage (the ledger depends on it). A 200 whose body is not a
JSON object is not an answer: it fails the attempt (`bad_response`), since each
sub-task's output is validated before it is billed (docs/design.md). It is ambiguous:
the upstream said 200, so it may have run (and billed) the request; it is sent again
only where `retry_policy.retry_unanswered` allows.

Prompt tokens are counted once, whatever the dialect: OpenAI's `prompt_tokens` already
includes its cached part (`prompt_tokens_details.cached_tokens`), while Anthropic's
`input_tokens` leaves out `cache_read_input_tokens` and `cache_creation_input_tokens`,
so for Anthropic the prompt is the sum of the three (what the model actually read).
`cached` (read from the cache) and `cache_write` (written to it) say how much of that
prompt the cache served or stored.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import orjson

from app.upstream.attempt import AttemptFailed, Reason


@dataclass(slots=True, init=False)
class Usage:
    """(Built on every request: its `__init__` is written out, so the compiled build runs it
    as C; docs/development.md, "The compiled build", says why.)"""

    prompt: int
    completion: int
    model: str | None
    reported: bool
    cached: int  # prompt tokens served from the upstream's prompt cache
    response_id: str | None  # the Responses API's id of the answer
    cache_write: int  # prompt tokens written to it (Anthropic's cache creation)
    tier: str | None  # the `service_tier` the upstream says served the request

    def __init__(
        self,
        prompt: int,
        completion: int,
        model: str | None,
        reported: bool = True,
        cached: int = 0,
        response_id: str | None = None,
        cache_write: int = 0,
        tier: str | None = None,
    ) -> None:
        self.prompt = prompt
        self.completion = completion
        self.model = model
        self.reported = reported
        self.cached = cached
        self.response_id = response_id
        self.cache_write = cache_write
        self.tier = tier


def parse_usage(body: bytes, *, anthropic: bool = False, responses: bool = False) -> Usage:
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise _bad("answer is not JSON") from None
    if not isinstance(obj, dict):
        raise _bad("answer is not an object")
    usage = _usage(obj, anthropic=anthropic, responses=responses)
    tier = obj.get("service_tier")
    return replace(usage, tier=tier) if isinstance(tier, str) else usage


def _usage(obj: dict[str, Any], *, anthropic: bool, responses: bool) -> Usage:
    usage = obj.get("usage")
    model = obj.get("model") if isinstance(obj.get("model"), str) else None
    if responses:
        return _responses_usage(obj, usage, model)
    if not isinstance(usage, dict):
        return Usage(0, 0, model, reported=False)
    if anthropic:
        read, write = anthropic_cache(usage)
        prompt = _int(usage.get("input_tokens")) + read + write
        return Usage(
            prompt, _int(usage.get("output_tokens")), model, cached=read, cache_write=write
        )
    prompt, completion = _int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens"))
    return Usage(
        prompt, completion, model, cached=cached_tokens(usage), cache_write=cache_writes(usage)
    )


def cached_tokens(usage: dict[str, Any]) -> int:
    """Prompt tokens read from the upstream's cache: OpenAI's
    `prompt_tokens_details.cached_tokens` (part of `prompt_tokens`; the Responses API's
    `input_tokens_details.cached_tokens`, part of `input_tokens`) or Anthropic's
    `cache_read_input_tokens` (which Anthropic counts apart from `input_tokens`)."""
    for name in ("prompt_tokens_details", "input_tokens_details"):
        details = usage.get(name)
        if isinstance(details, dict) and "cached_tokens" in details:
            return _int(details["cached_tokens"])
    return _int(usage.get("cache_read_input_tokens"))


def _responses_usage(obj: dict[str, Any], usage: object, model: str | None) -> Usage:
    """A Response object: `input_tokens` (cached ones included), `output_tokens`, and
    its id. A background response answered `queued` has no usage yet."""
    ident = obj.get("id")
    rid = ident if isinstance(ident, str) else None
    if not isinstance(usage, dict):
        return Usage(0, 0, model, reported=False, response_id=rid)
    return Usage(
        _int(usage.get("input_tokens")),
        _int(usage.get("output_tokens")),
        model,
        cached=cached_tokens(usage),
        response_id=rid,
    )


def cache_writes(usage: dict[str, Any]) -> int:
    """Prompt tokens written to OpenAI's cache (`prompt_tokens_details.cache_write_tokens`,
    part of `prompt_tokens`, priced at `billing.prices.*.cache_write` when set)."""
    details = usage.get("prompt_tokens_details")
    return _int(details.get("cache_write_tokens")) if isinstance(details, dict) else 0


def anthropic_cache(usage: dict[str, Any]) -> tuple[int, int]:
    """(cache read, cache creation) input tokens of an Anthropic usage object."""
    return _int(usage.get("cache_read_input_tokens")), _int(
        usage.get("cache_creation_input_tokens")
    )


def _bad(detail: str) -> AttemptFailed:
    return AttemptFailed(Reason.BAD_RESPONSE, retryable=True, ambiguous=True, detail=detail)


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
