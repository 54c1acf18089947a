"""The OpenAI (and Anthropic Messages) wire format: just enough validation.

Only the fields the gateway acts on are checked, each with a clear OpenAI-style 400
naming the parameter; everything else passes through to the upstream untouched.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from app.errors import InvalidRequest, PermissionDenied
from app.kinds import ServiceTier
from app.limits import estimate
from app.pipeline.request import (
    CHAT,
    COMPLETIONS,
    COUNT_TOKENS,
    EMBEDDINGS,
    MESSAGES,
    ClientRequest,
    Endpoint,
)
from app.runtime import KeySpec

MAX_CHOICES = 128


def parse_json(raw: bytes) -> dict[str, Any]:
    if not raw:
        raise InvalidRequest("the request body is empty; send a JSON object", code="invalid_json")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(
            f"the request body is not valid JSON ({exc.msg})", code="invalid_json"
        ) from None
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object", code="invalid_json")
    return body


def _opt_int(body: dict[str, Any], name: str, lo: int, hi: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"'{name}' must be an integer", param=name, code="invalid_type")
    if value < lo or (hi is not None and value > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
        raise InvalidRequest(
            f"'{name}' must be {bound} (got {value})", param=name, code="invalid_value"
        )
    return value


def _opt_type(body: dict[str, Any], name: str, kind: type | tuple[type, ...], what: str) -> None:
    value = body.get(name)
    if value is not None and not isinstance(value, kind):
        raise InvalidRequest(f"'{name}' must be {what}", param=name, code="invalid_type")


def _model(body: dict[str, Any]) -> str | None:
    model = body.get("model")
    if model is None:
        return None
    if not isinstance(model, str) or not model.strip():
        raise InvalidRequest(
            "'model' must be a non-empty string", param="model", code="invalid_type"
        )
    return model


def _messages(body: dict[str, Any]) -> list[Any]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest(
            "'messages' must be a non-empty array", param="messages", code="invalid_type"
        )
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise InvalidRequest(
                f"'messages[{i}]' must be an object with a string 'role'",
                param=f"messages[{i}]",
                code="invalid_type",
            )
    return messages


def _stream(body: dict[str, Any], endpoint: Endpoint) -> bool:
    _opt_type(body, "stream", bool, "a boolean")
    _opt_type(body, "stream_options", dict, "an object")
    stream = body.get("stream") is True
    if stream and not endpoint.streamable:
        raise InvalidRequest(f"'{endpoint.path}' does not support streaming", param="stream")
    return stream


def _text_input(body: dict[str, Any], name: str) -> Any:
    value = body.get(name)
    if isinstance(value, str) or (isinstance(value, list) and value):
        return value
    raise InvalidRequest(
        f"'{name}' must be a string or a non-empty array", param=name, code="invalid_type"
    )


def _responses_input(body: dict[str, Any]) -> int:
    """Check the Responses API fields the gateway acts on; the prompt estimate."""
    items = body.get("input")
    if items is not None and not isinstance(items, str | list):
        raise InvalidRequest(
            "'input' must be a string or an array of input items",
            param="input",
            code="invalid_type",
        )
    _opt_type(body, "instructions", str, "a string")
    _opt_type(body, "previous_response_id", str, "a string")
    _opt_type(body, "store", bool, "a boolean")
    _opt_type(body, "background", bool, "a boolean")
    _opt_type(body, "tools", list, "an array")
    return estimate.responses_prompt_tokens(items, body.get("instructions"), body.get("tools"))


_TIERS = {t.value: t for t in ServiceTier}


def service_tier(body: dict[str, Any], key: KeySpec) -> ServiceTier | None:
    """The tier the request is served in: the key's forced one, else the one it asks
    for if the key may use it (403 otherwise); None: it asks for none."""
    asked = body.get("service_tier")
    if asked is None and key.service_tier is None:
        return None
    tier = _TIERS.get(asked) if isinstance(asked, str) else None
    if asked is not None and tier is None:
        raise InvalidRequest(
            f"'service_tier' must be one of {', '.join(_TIERS)}",
            param="service_tier",
            code="invalid_value",
        )
    if key.service_tier is not None:
        return key.service_tier
    allowed = key.service_tiers
    if tier is not None and allowed is not None and tier not in allowed:
        raise PermissionDenied(
            f"this key may not use service_tier '{tier}' (allowed: "
            f"{', '.join(sorted(allowed)) or 'none'})",
            param="service_tier",
            code="service_tier_not_allowed",
        )
    return tier


def parse_call(
    endpoint: Endpoint,
    raw: bytes,
    key: KeySpec,
    request_id: str,
    headers: Mapping[str, str],
    started: float,
) -> ClientRequest:
    body = parse_json(raw)
    model = _model(body)
    stream = _stream(body, endpoint)
    choices = _opt_int(body, "n", 1, MAX_CHOICES) or 1
    if endpoint is CHAT:
        messages = _messages(body)
        max_tokens = _opt_int(body, "max_completion_tokens", 1) or _opt_int(body, "max_tokens", 1)
        prompt = estimate.chat_prompt_tokens(messages, body.get("tools"))
    elif endpoint is COMPLETIONS:
        prompt = estimate.input_tokens(_text_input(body, "prompt"))
        max_tokens = _opt_int(body, "max_tokens", 0)
        max_tokens = 16 if max_tokens is None else max_tokens  # the API's documented default
    elif endpoint is EMBEDDINGS:
        prompt = estimate.input_tokens(_text_input(body, "input"))
        max_tokens = 0
    elif endpoint.responses:
        prompt = _responses_input(body)
        max_tokens = _opt_int(body, "max_output_tokens", 1)
    elif endpoint is MESSAGES or endpoint is COUNT_TOKENS:
        messages = _messages(body)
        max_tokens = _opt_int(body, "max_tokens", 1)
        if max_tokens is None and endpoint is MESSAGES:
            raise InvalidRequest("'max_tokens' is required", param="max_tokens")
        tools = body.get("tools")
        prompt = estimate.chat_prompt_tokens(messages, tools) + estimate.system_tokens(
            body.get("system")
        )
    else:  # pragma: no cover - the routes only pass the endpoints above
        raise AssertionError(endpoint)
    return ClientRequest(
        endpoint=endpoint,
        key=key,
        request_id=request_id,
        raw=raw,
        body=body,
        model=model,
        stream=stream,
        max_tokens=max_tokens,
        prompt_tokens=prompt,
        choices=choices,
        client_headers=headers,
        started=started,
        service_tier=service_tier(body, key),
    )
