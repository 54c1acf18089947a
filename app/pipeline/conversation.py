"""Which conversation a request belongs to: the key prompt-cache affinity routes by.

Read once per request, and only when it matters (affinity on, more than one domain could
serve it). The first of these the request carries names the session:

    prompt_cache_key          OpenAI's own cache-routing key
    previous_response_id      Responses API: the conversation it continues
    safety_identifier, user   OpenAI's per-end-user ids
    metadata.user_id          Anthropic's (Claude Code puts its session id in it)
    x-session-id header       any client (also Claude Code's x-claude-code-session-id)

else a digest of the prompt's leading part: the system prompt and the first message,
which every turn of a conversation repeats. That digest reads text only (a string
content and a text block are the same; `cache_control` markers, which agents move
between turns, are not text), and skips Claude Code's per-version billing line.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from app.limits.sessions import HEADERS

_FIELDS = ("prompt_cache_key", "previous_response_id", "safety_identifier", "user")
# x-session-id, Claude Code's x-claude-code-session-id, Codex's session-id / thread-id
SESSION_HEADERS = frozenset(HEADERS)
_SKIPPED_TEXT = "x-anthropic-billing-header:"
_NOT_TEXT = frozenset({"cache_control", "type", "id", "signature"})


def session_key(body: Mapping[str, Any], header: str | None) -> bytes:
    for name in _FIELDS:
        value = body.get(name)
        if isinstance(value, str) and value:
            return f"{name}:{value}".encode()
    metadata = body.get("metadata")
    user = metadata.get("user_id") if isinstance(metadata, dict) else None
    if isinstance(user, str) and user:
        return f"user_id:{user}".encode()
    if header:
        return f"header:{header}".encode()
    return b"prefix:" + _prefix_digest(body)


def _prefix_digest(body: Mapping[str, Any]) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for text in _texts([body.get("system"), body.get("instructions"), *_leading(body)]):
        if not text.startswith(_SKIPPED_TEXT):
            h.update(text.encode("utf-8", "surrogatepass"))
            h.update(b"\x00")
    return h.digest()


def _leading(body: Mapping[str, Any]) -> list[Any]:
    """The system/developer messages a chat starts with, and the first other one."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        given = body.get("input")  # the Responses API: a list of items, or one string
        messages = given if isinstance(given, list) else [given] if isinstance(given, str) else []
    out: list[Any] = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else message
        out.append(content)
        if not isinstance(message, dict) or message.get("role") not in ("system", "developer"):
            break
    return out


def _texts(values: list[Any]) -> list[str]:
    """Every string in `values`, in order (an explicit stack: hostile nesting is safe)."""
    found: list[str] = []
    stack: list[Any] = list(reversed(values))
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            found.append(item)
        elif isinstance(item, dict):
            stack.extend(reversed([v for k, v in item.items() if k not in _NOT_TEXT]))
        elif isinstance(item, list):
            stack.extend(reversed(item))
    return found
