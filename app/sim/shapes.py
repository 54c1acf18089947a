"""Answer shapes of each endpoint: OpenAI chat/completions/embeddings, Anthropic messages
(in `messages.py`).

A chat or Messages request that offers tools is answered with a deterministic tool call
(`tools.py`), and its usage reports what the simulator's prompt cache served
(`cache.py`): `prompt_tokens_details.cached_tokens` for chat.
"""

from __future__ import annotations

import base64
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from app.sim import prompts, text
from app.sim.cache import CacheUse, PromptCache
from app.sim.knobs import SimKnobs
from app.sim.messages import bad_signature, message_body, message_events, sse
from app.sim.refusals import SimError
from app.sim.tools import ToolCall, choose, split_json, tool_call_tokens

_VALID = "invalid_request_error"
_KIND = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
    "/v1/messages": "messages",
}


def bad(message: str) -> SimError:
    return SimError(400, message, _VALID)


def _max_tokens(body: dict[str, Any], name: str, default: int | None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise bad(f"'{name}' must be a non-negative integer")
    return value


@dataclass
class SimReply:
    """The answer the simulator will give to one request (`build`), whole or streamed."""

    kind: str
    model: str
    body: dict[str, Any]
    stream: bool
    prompt_tokens: int
    words: list[str]
    finish: str
    include_usage: bool
    quota_tokens: int
    dim: int = 16
    created: int = 0
    ident: str = ""
    tool_call: ToolCall | None = None
    cache: CacheUse = field(default_factory=CacheUse)

    @property
    def tier(self) -> str:
        """The `service_tier` it is served in, as OpenAI reports it: the one asked for,
        `default` for `auto` or none."""
        asked = self.body.get("service_tier")
        return asked if asked in ("flex", "priority") else "default"

    @property
    def choices(self) -> int:
        n = self.body.get("n") or 1
        return n if isinstance(n, int) else 1

    @property
    def completion_tokens(self) -> int:
        if self.kind == "embeddings":
            return 0
        if self.tool_call is not None:
            return tool_call_tokens(self.tool_call) * self.choices
        return len(self.words) * self.choices

    def usage(self) -> dict[str, Any]:
        c = self.completion_tokens
        usage: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": c,
            "total_tokens": self.prompt_tokens + c,
        }
        if self.kind == "chat":
            usage["prompt_tokens_details"] = {"cached_tokens": self.cache.read}
        return usage

    def json_body(self) -> dict[str, Any]:
        if self.kind == "messages":
            return message_body(self)
        if self.kind == "embeddings":
            return self._embeddings()
        content = "".join(w + " " for w in self.words)
        if self.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if self.tool_call is not None:
                message = {"role": "assistant", "content": None, "tool_calls": [_call(self)]}
            choices = [
                {"index": i, "message": message, "logprobs": None, "finish_reason": self.finish}
                for i in range(self.choices)
            ]
            return {
                "id": self.ident,
                "object": "chat.completion",
                "created": self.created,
                "model": self.model,
                "choices": choices,
                "usage": self.usage(),
                "service_tier": self.tier,
                "system_fingerprint": "tokengate-sim",
            }
        choices = [
            {"index": i, "text": content, "logprobs": None, "finish_reason": self.finish}
            for i in range(self.choices)
        ]
        return {
            "id": self.ident,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": self.usage(),
        }

    def _embeddings(self) -> dict[str, Any]:
        inputs = self.body["input"]
        items = [inputs] if isinstance(inputs, str) else inputs
        b64 = self.body.get("encoding_format") == "base64"
        data = []
        for i, item in enumerate(items):
            vec = text.embedding(text.seed_of(item), self.dim)
            value: Any = (
                base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode() if b64 else vec
            )
            data.append({"object": "embedding", "index": i, "embedding": value})
        return {
            "object": "list",
            "data": data,
            "model": self.model,
            "usage": {"prompt_tokens": self.prompt_tokens, "total_tokens": self.prompt_tokens},
        }

    def events(self) -> Iterator[tuple[bytes, bool]]:
        """(SSE event, carries content) in order."""
        if self.kind == "messages":
            yield from message_events(self)
            return
        if self.tool_call is not None:
            yield from self._tool_call_events(self.tool_call)
        else:
            for i, word in enumerate(self.words):
                yield sse(self._chunk({"content": word + " "}, None, first=i == 0)), True
            if not self.words:
                yield sse(self._chunk({"content": ""}, None, first=True)), False
        yield sse(self._chunk(None, self.finish)), False
        if self.include_usage:
            yield sse({**self._base(), "choices": [], "usage": self.usage()}), False
        yield b"data: [DONE]\n\n", False

    def _tool_call_events(self, call: ToolCall) -> Iterator[tuple[bytes, bool]]:
        head = {"index": 0, "id": f"call_{call.ident}", "type": "function"}
        opening = {**head, "function": {"name": call.name, "arguments": ""}}
        yield sse(self._chunk({"content": None, "tool_calls": [opening]}, None, True)), False
        for piece in split_json(call.arguments_json):
            delta = {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
            yield sse(self._chunk(delta, None)), True

    def _base(self) -> dict[str, Any]:
        if self.kind != "chat":
            obj = "text_completion"
            return {"id": self.ident, "object": obj, "created": self.created, "model": self.model}
        return {
            "id": self.ident,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "service_tier": self.tier,
        }

    def _chunk(
        self, delta: dict[str, Any] | None, finish: str | None, first: bool = False
    ) -> dict[str, Any]:
        if self.kind == "chat":
            delta = dict(delta or {})
            if first:
                delta["role"] = "assistant"
            choice: dict[str, Any] = {
                "index": 0,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish,
            }
        else:
            content = (delta or {}).get("content") or ""
            choice = {"index": 0, "text": content, "logprobs": None, "finish_reason": finish}
        out = {**self._base(), "choices": [choice]}
        if self.include_usage:
            out["usage"] = None
        return out


def _call(job: SimReply) -> dict[str, Any]:
    call = job.tool_call
    assert call is not None
    return {
        "id": f"call_{call.ident}",
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments_json},
    }


def _chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if (
        not isinstance(messages, list)
        or not messages
        or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages)
    ):
        raise bad("'messages' must be a non-empty array of messages")
    return messages


def read_prompt(kind: str, body: dict[str, Any]) -> prompts.Prompt:
    """The chat or Messages prompt of a request (400 if its messages are malformed)."""
    messages = _chat_messages(body)
    return prompts.messages(body, messages) if kind == "messages" else prompts.chat(body, messages)


def build(
    path: str,
    body: dict[str, Any],
    model: str,
    knobs: SimKnobs,
    cache: PromptCache | None = None,
) -> SimReply:
    kind = _KIND[path]
    stream = body.get("stream") is True
    if stream and kind == "embeddings":
        raise bad("embeddings do not stream")
    n = body.get("n") or 1
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise bad("'n' must be a positive integer")
    if body.get("service_tier") not in (None, "auto", "default", "flex", "priority"):
        raise bad("'service_tier' must be one of auto, default, flex, priority")
    opts = body.get("stream_options")
    include_usage = isinstance(opts, dict) and opts.get("include_usage") is True
    call: ToolCall | None = None
    use = CacheUse()
    if kind in ("chat", "messages"):
        prompt = read_prompt(kind, body)
        tokens, seed = prompt.tokens, text.seed_of(body["messages"][-1].get("content"))
        if prompt.wants_tool(knobs.tool_calls):
            call = choose(prompt.tools, prompt.forced, prompt.last_user_text)
        if cache is not None:
            use = cache.use(prompt.segments, prompt.rule)
        limit = (
            _max_tokens(body, "max_tokens", None)
            if kind == "messages"
            else _max_tokens(body, "max_completion_tokens", None)
            or _max_tokens(body, "max_tokens", None)
        )
        if kind == "messages" and limit is None:
            raise bad("max_tokens: Field required")
        if kind == "messages" and (problem := bad_signature(body["messages"])) is not None:
            raise bad(problem)
    elif kind == "completions":
        if "prompt" not in body:
            raise bad("'prompt' is required")
        tokens, seed = text.input_tokens(body["prompt"]), text.seed_of(body["prompt"])
        limit = _max_tokens(body, "max_tokens", 16)
    else:
        if not isinstance(body.get("input"), str | list) or not body.get("input"):
            raise bad("'input' must be a non-empty string or array")
        tokens, seed, limit = text.input_tokens(body["input"]), "", 0
    want = knobs.reply_tokens if limit is None else min(limit, knobs.reply_tokens)
    words = text.reply_words(seed, want) if kind != "embeddings" else []
    finish = "length" if limit is not None and limit < knobs.reply_tokens else "stop"
    if call is not None:
        finish = "tool_calls"
    reserve = limit if limit is not None else knobs.reply_tokens
    prefix = {"chat": "chatcmpl", "completions": "cmpl", "messages": "msg", "embeddings": "emb"}
    return SimReply(
        kind=kind,
        model=model,
        body=body,
        stream=stream,
        prompt_tokens=tokens,
        words=words,
        finish=finish,
        include_usage=include_usage,
        quota_tokens=tokens + reserve * n,
        dim=knobs.embedding_dim,
        created=int(time.time()),
        ident=f"{prefix[kind]}-sim{time.monotonic_ns():x}",
        tool_call=call,
        cache=use,
    )
