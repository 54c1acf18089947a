"""What a domain's upstream gets of the comma-list API headers a client sends
(`anthropic-beta`, `openai-beta`): a per-domain policy, and the values it refused.

Claude Code sends new dated betas (`interleaved-thinking-2025-05-14`, ...) with most
releases. A permissive upstream ignores one it does not know; a strict one (Vertex,
Bedrock, some relays) answers 400 and the agent's turn fails. So, per domain and per
header (`[scale_up.headers.anthropic-beta]`):

    client value ──► drop: matches a `drop` pattern?                     removed
                 ──► rename: an exact `rename` key?                        replaced
                 ──► allow: set, and the (renamed) value matches none?     removed
                 ──► refused by this upstream before (an earlier 400)?     removed
                 ──► sent (duplicates once)

Nothing set is `pass`: the header goes as the client sent it. A 400 whose error message
names a value that was sent (Anthropic and Vertex: "Unexpected value(s) `x` for the
`anthropic-beta` header") is sent again once without the named values (`retry_refused`):
a 400 is a refusal, the upstream acted on nothing. The values are then remembered for the
domain (at most `MAX_REFUSED`, until a reload), so later requests drop them up front.
A message that names no value sent (Bedrock's bare "invalid beta flag") is relayed as
it came: say what that upstream takes with `allow`.

Patterns are shell-style globs (`*-2026-*`, `context-1m-*`), matched whole and
case-sensitively, compiled once per domain. Pure: no I/O here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import translate

import orjson

from app.config.cluster import HeaderPolicyConfig

MAX_REFUSED = 64  # values remembered as refused per domain and header
_MAX_MESSAGE = 4096  # characters of an error message searched for refused values


def _patterns(globs: list[str]) -> re.Pattern[str] | None:
    if not globs:
        return None
    return re.compile("|".join(f"(?:{translate(g)})" for g in globs))


def split(value: str) -> list[str]:
    return [v for v in (p.strip() for p in value.split(",")) if v]


@dataclass
class ValuePolicy:
    """One header's policy on one domain, compiled, and the values its upstream refused."""

    header: str
    drop: re.Pattern[str] | None = None
    rename: Mapping[str, str] = field(default_factory=dict)
    allow: re.Pattern[str] | None = None
    retry_refused: bool = True
    refused: set[str] = field(default_factory=set)

    @classmethod
    def compile(cls, header: str, cfg: HeaderPolicyConfig | None) -> ValuePolicy:
        if cfg is None:
            return cls(header)
        allow = None if cfg.allow is None else _patterns(cfg.allow) or re.compile(r"(?!)")
        return cls(header, _patterns(cfg.drop), dict(cfg.rename), allow, cfg.retry_refused)

    @property
    def passes(self) -> bool:
        """Nothing to do: the client's value goes as it came."""
        return self.drop is None and not self.rename and self.allow is None and not self.refused

    def apply(self, value: str) -> str | None:
        """The value to send (None: send no header)."""
        if self.passes:
            return value
        kept: list[str] = []
        for item in split(value):
            if self.drop is not None and self.drop.fullmatch(item):
                continue
            item = self.rename.get(item, item)
            if self.allow is not None and not self.allow.fullmatch(item):
                continue
            if item not in self.refused and item not in kept:
                kept.append(item)
        return ",".join(kept) or None

    def refusal(self, sent: str, body: bytes) -> list[str]:
        """The sent values a 400's error message names (empty: not a refusal of ours)."""
        if not self.retry_refused:
            return []
        message = error_message(body)
        if not message or "beta" not in message.lower():
            return []
        return [v for v in split(sent) if _names(message, v)]

    def remember(self, values: list[str]) -> None:
        for value in values:
            if len(self.refused) < MAX_REFUSED:
                self.refused.add(value)


def _names(message: str, value: str) -> bool:
    """`value` appears in `message` as a whole token (not inside a longer beta name)."""
    start = message.find(value)
    while start != -1:
        end = start + len(value)
        before = message[start - 1] if start else " "
        after = message[end] if end < len(message) else " "
        if not _token_char(before) and not _token_char(after):
            return True
        start = message.find(value, start + 1)
    return False


def _token_char(ch: str) -> bool:
    return ch.isalnum() or ch in "-_."


def error_message(body: bytes) -> str:
    """The `error.message` of an OpenAI- or Anthropic-shaped error body (or a bare
    `message`), bounded; "" when there is none."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return ""
    if not isinstance(data, dict):
        return ""
    error = data.get("error")
    message = error.get("message") if isinstance(error, dict) else data.get("message")
    return message[:_MAX_MESSAGE] if isinstance(message, str) else ""


class HeaderPolicies:
    """Every policed header of one domain. Unconfigured headers pass (and still learn
    what the upstream refuses)."""

    HEADERS = ("anthropic-beta", "openai-beta")

    def __init__(self, configs: Mapping[str, HeaderPolicyConfig]) -> None:
        self.policies: dict[str, ValuePolicy] = {}
        self.reconfigure(configs)

    def reconfigure(self, configs: Mapping[str, HeaderPolicyConfig]) -> None:
        """The rules (at start and on a reload, which also forgets the refused values
        learned so far: the upstream may have been upgraded)."""
        self.policies = {h: ValuePolicy.compile(h, configs.get(h)) for h in self.HEADERS}

    def outgoing(self, headers: dict[str, str]) -> None:
        """Apply the policies to the outgoing `headers`, in place."""
        for name, policy in self.policies.items():
            value = headers.get(name)
            if value is None or policy.passes:
                continue
            kept = policy.apply(value)
            if kept is None:
                del headers[name]
            else:
                headers[name] = kept

    def refused(self, headers: Mapping[str, str], body: bytes) -> dict[str, list[str]]:
        """Per header, the values a 400 `body` says the upstream refused."""
        found: dict[str, list[str]] = {}
        for name, policy in self.policies.items():
            sent = headers.get(name)
            if sent and (values := policy.refusal(sent, body)):
                found[name] = values
        return found

    @staticmethod
    def without(headers: dict[str, str], refused: Mapping[str, list[str]]) -> None:
        """Take the `refused` values out of the outgoing `headers`, in place."""
        for name, values in refused.items():
            kept = ",".join(v for v in split(headers[name]) if v not in values)
            if kept:
                headers[name] = kept
            else:
                del headers[name]

    def learn(self, refused: Mapping[str, list[str]]) -> None:
        for name, values in refused.items():
            self.policies[name].remember(values)
