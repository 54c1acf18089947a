"""Answer shapes of each endpoint: OpenAI chat/completions/embeddings, Anthropic messages."""

from __future__ import annotations

import base64
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from app.sim import text
from app.sim.errors import SimError
from app.sim.knobs import SimKnobs

_VALID = "invalid_request_error"


def _bad(message: str) -> SimError:
    return SimError(400, message, _VALID)


def _max_tokens(body: dict[str, Any], name: str, default: int | None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _bad(f"'{name}' must be a non-negative integer")
    return value


@dataclass
class Job:
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

    @property
    def completion_tokens(self) -> int:
        return len(self.words) * (self.body.get("n") or 1) if self.kind != "embeddings" else 0

    def usage(self) -> dict[str, int]:
        c = self.completion_tokens
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": c,
            "total_tokens": self.prompt_tokens + c,
        }

    def json_body(self) -> dict[str, Any]:
        content = "".join(w + " " for w in self.words)
        if self.kind == "chat":
            choices = [
                {
                    "index": i,
                    "message": {"role": "assistant", "content": content},
                    "logprobs": None,
                    "finish_reason": self.finish,
                }
                for i in range(self.body.get("n") or 1)
            ]
            return {
                "id": self.ident,
                "object": "chat.completion",
                "created": self.created,
                "model": self.model,
                "choices": choices,
                "usage": self.usage(),
                "system_fingerprint": "tokengate-sim",
            }
        if self.kind == "completions":
            choices = [
                {"index": i, "text": content, "logprobs": None, "finish_reason": self.finish}
                for i in range(self.body.get("n") or 1)
            ]
            return {
                "id": self.ident,
                "object": "text_completion",
                "created": self.created,
                "model": self.model,
                "choices": choices,
                "usage": self.usage(),
            }
        if self.kind == "messages":
            return {
                "id": self.ident,
                "type": "message",
                "role": "assistant",
                "model": self.model,
                "content": [{"type": "text", "text": content}],
                "stop_reason": "max_tokens" if self.finish == "length" else "end_turn",
                "stop_sequence": None,
                "usage": {"input_tokens": self.prompt_tokens, "output_tokens": len(self.words)},
            }
        return self._embeddings()

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
            yield from self._anthropic_events()
            return
        for i, word in enumerate(self.words):
            yield _sse(self._chunk(word + " ", None, first=i == 0)), True
        if not self.words:
            yield _sse(self._chunk("", None, first=True)), False
        yield _sse(self._chunk(None, self.finish)), False
        if self.include_usage:
            yield _sse({**self._base(), "choices": [], "usage": self.usage()}), False
        yield b"data: [DONE]\n\n", False

    def _base(self) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {"id": self.ident, "object": obj, "created": self.created, "model": self.model}

    def _chunk(
        self, content: str | None, finish: str | None, first: bool = False
    ) -> dict[str, Any]:
        if self.kind == "chat":
            delta: dict[str, Any] = {} if content is None else {"content": content}
            if first:
                delta["role"] = "assistant"
            choice: dict[str, Any] = {
                "index": 0,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish,
            }
        else:
            choice = {"index": 0, "text": content or "", "logprobs": None, "finish_reason": finish}
        out = {**self._base(), "choices": [choice]}
        if self.include_usage:
            out["usage"] = None
        return out

    def _anthropic_events(self) -> Iterator[tuple[bytes, bool]]:
        start = {
            "type": "message_start",
            "message": {
                "id": self.ident,
                "type": "message",
                "role": "assistant",
                "model": self.model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 1},
            },
        }
        yield _sse(start, "message_start"), False
        yield (
            _sse(
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": ""},
                },
                "content_block_start",
            ),
            False,
        )
        for word in self.words:
            yield (
                _sse(
                    {
                        "type": "content_block_delta",
                        "index": 0,
                        "delta": {"type": "text_delta", "text": word + " "},
                    },
                    "content_block_delta",
                ),
                True,
            )
        yield _sse({"type": "content_block_stop", "index": 0}, "content_block_stop"), False
        stop = "max_tokens" if self.finish == "length" else "end_turn"
        yield (
            _sse(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": len(self.words)},
                },
                "message_delta",
            ),
            False,
        )
        yield _sse({"type": "message_stop"}, "message_stop"), False


def _sse(obj: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(obj) + b"\n\n"


def build(path: str, body: dict[str, Any], model: str, knobs: SimKnobs) -> Job:
    kind = {
        "/v1/chat/completions": "chat",
        "/v1/completions": "completions",
        "/v1/embeddings": "embeddings",
        "/v1/messages": "messages",
    }[path]
    stream = body.get("stream") is True
    if stream and kind == "embeddings":
        raise _bad("embeddings do not stream")
    n = body.get("n") or 1
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise _bad("'n' must be a positive integer")
    opts = body.get("stream_options")
    include_usage = isinstance(opts, dict) and opts.get("include_usage") is True
    if kind in ("chat", "messages"):
        messages = body.get("messages")
        if (
            not isinstance(messages, list)
            or not messages
            or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages)
        ):
            raise _bad("'messages' must be a non-empty array of messages")
        prompt = text.chat_prompt_tokens(messages, body.get("system"))
        seed = text.seed_of(messages[-1].get("content"))
        limit = (
            _max_tokens(body, "max_tokens", None)
            if kind == "messages"
            else _max_tokens(body, "max_completion_tokens", None)
            or _max_tokens(body, "max_tokens", None)
        )
        if kind == "messages" and limit is None:
            raise _bad("max_tokens: Field required")
    elif kind == "completions":
        if "prompt" not in body:
            raise _bad("'prompt' is required")
        prompt, seed = text.input_tokens(body["prompt"]), text.seed_of(body["prompt"])
        limit = _max_tokens(body, "max_tokens", 16)
    else:
        if not isinstance(body.get("input"), str | list) or not body.get("input"):
            raise _bad("'input' must be a non-empty string or array")
        prompt, seed, limit = text.input_tokens(body["input"]), "", 0
    want = knobs.reply_tokens if limit is None else min(limit, knobs.reply_tokens)
    words = text.reply_words(seed, want) if kind != "embeddings" else []
    finish = "length" if limit is not None and limit < knobs.reply_tokens else "stop"
    reserve = limit if limit is not None else knobs.reply_tokens
    prefix = {"chat": "chatcmpl", "completions": "cmpl", "messages": "msg", "embeddings": "emb"}
    return Job(
        kind=kind,
        model=model,
        body=body,
        stream=stream,
        prompt_tokens=prompt,
        words=words,
        finish=finish,
        include_usage=include_usage,
        quota_tokens=prompt + reserve * n,
        dim=knobs.embedding_dim,
        created=int(time.time()),
        ident=f"{prefix[kind]}-sim{time.monotonic_ns():x}",
    )
