"""The simulator's Responses API answers: what a request produces, as an object and as
the typed event stream (pure: no state, no I/O; `responses_routes.py` keeps the state).

What it answers, deterministically:
- a request with function `tools` whose input does not end with a tool's output (and
  `tool_choice` is not "none"): one `function_call` to the first function tool (or the
  one `tool_choice` names), its arguments built from the tool's JSON schema and the
  prompt (a `cmd`/`command` argument is a harmless `echo` of a few words, so a coding
  agent can run it);
- otherwise a text message of `reply_tokens` words chosen from the prompt (cut to
  `max_output_tokens`, the response then `incomplete`);
- with `reasoning.summary` asked for, a reasoning item first (its summary counts as
  reasoning tokens, carried encrypted when `include` asks for it).

Usage is counted the simulator's way (`text.py`): 3 tokens per input item plus its
words; `cached_tokens` is what a prompt cache would have held (the part of the context
continued from `previous_response_id`, or the prefix repeated under the same
`prompt_cache_key`); output tokens are the words generated.
"""

from __future__ import annotations

import base64
import hashlib
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from app.sim import response_tools, text
from app.sim.refusals import SimError
from app.sim.tools import ToolMode

ITEM_OVERHEAD = 3
_NOT_TEXT = frozenset({"id", "type", "call_id", "role", "status"})  # framing, not words
SUMMARY = "Planning a short answer."


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def bad(message: str, code: str | None = None) -> SimError:
    return SimError(400, message, "invalid_request_error", code)


# -- counting -----------------------------------------------------------------------------
def _strings(value: Any) -> Iterator[str]:
    """Every string in a JSON value (an explicit stack: hostile nesting must not crash)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            stack.extend(v for k, v in item.items() if k not in _NOT_TEXT)
        elif isinstance(item, list):
            stack.extend(reversed(item))


def item_tokens(item: Any) -> int:
    return ITEM_OVERHEAD + sum(text.count_text(s) for s in _strings(item))


def items_tokens(items: list[Any]) -> int:
    return sum(item_tokens(i) for i in items)


def prompt_tokens(context: list[Any], body: dict[str, Any]) -> int:
    extra = [body.get("instructions"), body.get("tools")]
    return items_tokens(context) + sum(text.count_text(s) for s in _strings(extra))


def fingerprint(items: list[Any]) -> list[bytes]:
    return [orjson.dumps(i, option=orjson.OPT_SORT_KEYS) for i in items]


# -- validating ----------------------------------------------------------------------------
def input_items(body: dict[str, Any]) -> list[dict[str, Any]]:
    """`input` as a list of item objects (a string is one user message)."""
    value = body.get("input")
    if value is None:
        return []
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, list):
        raise bad("'input' must be a string or an array")
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise bad(f"'input[{i}]' must be an object")
        kind = item.get("type", "message")
        if kind == "message" and not isinstance(item.get("role"), str):
            raise bad(f"'input[{i}].role' is required")
    return value


def check_outputs(context: list[Any], items: list[dict[str, Any]]) -> None:
    """A tool's output must answer a call made earlier in the conversation."""
    problem = response_tools.check_outputs(context, items)
    if problem is not None:
        raise bad(problem)


# -- answering ------------------------------------------------------------------------------
@dataclass
class Plan:
    """What one request produces (before any state is kept)."""

    response: dict[str, Any]  # the final Response object
    prompt: int
    cached: int
    output_tokens: int


def _last_user_text(items: list[dict[str, Any]]) -> str:
    for item in reversed(items):
        if item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, str):
                return content
            parts = content if isinstance(content, list) else []
            return " ".join(
                str(p.get("text")) for p in parts if isinstance(p, dict) and "text" in p
            )
    return ""


def _argument(name: str, schema: Any, words: list[str]) -> Any:
    kind = schema.get("type") if isinstance(schema, dict) else "string"
    if kind == "array":
        return ["echo", *words] if name in ("cmd", "command") else list(words)
    if kind in ("integer", "number"):
        return len(words)
    if kind == "boolean":
        return False
    if kind == "object":
        return {}
    return "echo " + " ".join(words) if name in ("cmd", "command") else " ".join(words)


def arguments(tool: dict[str, Any], words: list[str]) -> str:
    params = tool.get("parameters")
    props = params.get("properties") if isinstance(params, dict) else None
    if not isinstance(props, dict):
        return "{}"
    required = params.get("required") if isinstance(params, dict) else None
    names = [n for n in props if not isinstance(required, list) or n in required]
    return orjson.dumps({n: _argument(n, props[n], words) for n in names}).decode()


def seed_of(items: list[dict[str, Any]]) -> str:
    if not items:
        return ""
    last = items[-1]
    return " ".join(_strings(last.get("output") if "output" in last else last.get("content")))


def _reasoning(body: dict[str, Any]) -> dict[str, Any] | None:
    reasoning = body.get("reasoning")
    if not isinstance(reasoning, dict) or not reasoning.get("summary"):
        return None
    item: dict[str, Any] = {
        "type": "reasoning",
        "id": new_id("rs"),
        "summary": [{"type": "summary_text", "text": SUMMARY}],
    }
    include = body.get("include")
    if isinstance(include, list) and "reasoning.encrypted_content" in include:
        item["encrypted_content"] = base64.b64encode(SUMMARY.encode()).decode()
    return item


def plan(
    body: dict[str, Any],
    model: str,
    context: list[Any],
    items: list[dict[str, Any]],
    cached: int,
    reply_tokens: int,
    tool_calls: ToolMode = "auto",
) -> Plan:
    """The final response to `items` continuing `context` (both already checked)."""
    limit = body.get("max_output_tokens")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise bad("'max_output_tokens' must be a positive integer")
    seed = seed_of(items)
    output: list[dict[str, Any]] = []
    reasoning_item = _reasoning(body)
    reasoning = text.count_text(SUMMARY) if reasoning_item else 0
    if reasoning_item:
        output.append(reasoning_item)
    tool = response_tools.to_call(body, items, tool_calls, _last_user_text(items))
    status, incomplete = "completed", None
    if tool is not None:
        call, args = _call(tool, text.reply_words(seed, 2))
        output.append(call)
        generated = text.count_text(args)
    else:
        want = reply_tokens if limit is None else min(limit, reply_tokens)
        words = text.reply_words(seed, want)
        output.append(_message(" ".join(words)))
        generated = len(words)
        if limit is not None and limit < reply_tokens:
            status, incomplete = "incomplete", {"reason": "max_output_tokens"}
    prompt = prompt_tokens([*context, *items], body)
    usage = {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": min(cached, prompt)},
        "output_tokens": generated + reasoning,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + generated + reasoning,
    }
    response = _response(body, model, status, output, usage)
    response["incomplete_details"] = incomplete
    return Plan(response, prompt, min(cached, prompt), generated + reasoning)


def _call(tool: response_tools.Offered, words: list[str]) -> tuple[dict[str, Any], str]:
    """The call item for `tool` and its generated text. Its `call_id` depends only on the
    request (the same conversation gets the same id), so a recorded conversation replays."""
    digest = hashlib.sha256(f"{tool.namespace}:{tool.name}:{' '.join(words)}".encode())
    base = {"call_id": f"call_{digest.hexdigest()[:24]}", "status": "completed"}
    if tool.kind == "custom":
        raw = " ".join(words)
        return {
            "type": "custom_tool_call",
            "id": new_id("ctc"),
            **base,
            "name": tool.name,
            "input": raw,
        }, raw
    if tool.kind == "tool_search":
        args = {"query": " ".join(words), "limit": 1}
        item = {
            "type": "tool_search_call",
            "id": new_id("tsc"),
            **base,
            "execution": "client",
            "arguments": args,
        }
        return item, " ".join(words)
    raw = arguments(tool.tool, words)
    item = {
        "type": "function_call",
        "id": new_id("fc"),
        **base,
        "name": tool.name,
        "arguments": raw,
    }
    if tool.namespace is not None:
        item["namespace"] = tool.namespace
    return item, raw


def _message(content: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": new_id("msg"),
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": content, "annotations": [], "logprobs": []}],
    }


def _response(
    body: dict[str, Any],
    model: str,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
) -> dict[str, Any]:
    now = int(time.time())
    return {
        "id": new_id("resp"),
        "object": "response",
        "created_at": now,
        "completed_at": now if status == "completed" else None,
        "status": status,
        "background": body.get("background") is True,
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": model,
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": body.get("reasoning") or {"effort": None, "summary": None},
        "store": body.get("store", True),
        "temperature": body.get("temperature", 1.0),
        "text": body.get("text") or {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_p": body.get("top_p", 1.0),
        "truncation": body.get("truncation", "disabled"),
        "usage": usage,
        "user": None,
        "metadata": body.get("metadata") or {},
    }


def snapshot(final: dict[str, Any], status: str) -> dict[str, Any]:
    """The response as it looks before it is done (no output, no usage yet)."""
    return {**final, "status": status, "output": [], "usage": None, "completed_at": None}


# -- streaming --------------------------------------------------------------------------------
def events(final: dict[str, Any], *, queued: bool = False) -> Iterator[tuple[dict[str, Any], bool]]:
    """The typed events of `final` in order (each with whether it carries generated
    content, for pacing and fault injection); `sequence_number` is added by `numbered`."""
    yield (
        {
            "type": "response.created",
            "response": snapshot(final, "queued" if queued else "in_progress"),
        },
        False,
    )
    if queued:
        yield {"type": "response.queued", "response": snapshot(final, "queued")}, False
    yield {"type": "response.in_progress", "response": snapshot(final, "in_progress")}, False
    for index, item in enumerate(final["output"]):
        yield from _item_events(index, item)
    yield {"type": f"response.{final['status']}", "response": final}, False


def _item_events(index: int, item: dict[str, Any]) -> Iterator[tuple[dict[str, Any], bool]]:
    kind, ident = item["type"], item["id"]
    at = {"item_id": ident, "output_index": index}
    if kind == "message":
        yield _added(index, {**item, "status": "in_progress", "content": []}), False
        part = item["content"][0]
        empty = {**part, "text": ""}
        yield (
            {"type": "response.content_part.added", **at, "content_index": 0, "part": empty},
            False,
        )
        for word in _pieces(part["text"]):
            delta = {"content_index": 0, "delta": word, "logprobs": []}
            yield {"type": "response.output_text.delta", **at, **delta}, True
        done = {"content_index": 0, "text": part["text"], "logprobs": []}
        yield {"type": "response.output_text.done", **at, **done}, False
        yield {"type": "response.content_part.done", **at, "content_index": 0, "part": part}, False
    elif kind == "function_call":
        yield _added(index, {**item, "arguments": "", "status": "in_progress"}), False
        for piece in _pieces(item["arguments"]):
            yield {"type": "response.function_call_arguments.delta", **at, "delta": piece}, True
        args = {"arguments": item["arguments"]}
        yield {"type": "response.function_call_arguments.done", **at, **args}, False
    elif kind == "custom_tool_call":
        yield _added(index, {**item, "input": "", "status": "in_progress"}), False
        for piece in _pieces(item["input"]):
            yield {"type": "response.custom_tool_call_input.delta", **at, "delta": piece}, True
        yield {"type": "response.custom_tool_call_input.done", **at, "input": item["input"]}, False
    elif kind == "tool_search_call":
        yield _added(index, {**item, "status": "in_progress"}), True
    elif kind == "reasoning":
        yield _added(index, {**item, "summary": []}), False
        summary = item["summary"][0]
        part = {"summary_index": 0, "part": {"type": "summary_text", "text": ""}}
        yield {"type": "response.reasoning_summary_part.added", **at, **part}, False
        delta = {"summary_index": 0, "delta": summary["text"]}
        yield {"type": "response.reasoning_summary_text.delta", **at, **delta}, True
        done = {"summary_index": 0, "text": summary["text"]}
        yield {"type": "response.reasoning_summary_text.done", **at, **done}, False
        finished = {"summary_index": 0, "part": summary}
        yield {"type": "response.reasoning_summary_part.done", **at, **finished}, False
    yield {"type": "response.output_item.done", "output_index": index, "item": item}, False


def _added(index: int, item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "response.output_item.added", "output_index": index, "item": item}


def _pieces(content: str) -> list[str]:
    """Word by word, each with the space that follows it (joined, the whole text)."""
    words = content.split(" ")
    return [w + " " for w in words[:-1]] + [words[-1]] if content else []


def sse(event: dict[str, Any], sequence: int) -> bytes:
    body = orjson.dumps({**event, "sequence_number": sequence})
    return f"event: {event['type']}\n".encode() + b"data: " + body + b"\n\n"
