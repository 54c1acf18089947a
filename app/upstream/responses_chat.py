"""The Responses API on an upstream that speaks only chat completions (`responses =
"chat"` on a domain): the request flattened onto chat, the answer restored.

    Responses body ──► to_chat ──► chat body + Tools (what each flat name stood for)
                                      │
    chat answer   ──► to_response(Tools) ──► a Response, items as the client declared them

Tools, both ways (a chat function name is all the upstream sees of a tool):

    function f                      ⇄ function f
    namespace ns { function f }     ⇄ function `ns__f`   (a function_call with `namespace`)
    custom c (grammar / text)       ⇄ function c({"input": string}), the grammar in its
                                      description          (a custom_tool_call, `input`)
    tool_search (client execution)  ⇄ function tool_search(its parameters)
                                                           (a tool_search_call, `arguments`)
    hosted tools (web_search...)    ⇄ left out: no chat upstream can run them

History keeps its adjacency: consecutive calls (of any kind) become one assistant message
with their `tool_calls`, each followed by its `role: "tool"` answer (from
`function_call_output`, `custom_tool_call_output` or `tool_search_output`); a
`tool_search_output`'s tools are also offered to the model from then on, as the Responses
API loads them. Reasoning items have no chat form and are left out. Pure: no I/O.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

SEP = "__"  # between a namespace and its tool's name in a flat chat name
_CALLS = frozenset({"function_call", "custom_tool_call", "tool_search_call"})
_OUTPUTS = frozenset({"function_call_output", "custom_tool_call_output", "tool_search_output"})
# Fields of a Responses request that chat completions takes under the same name.
_SAME = (
    "temperature",
    "top_p",
    "parallel_tool_calls",
    "user",
    "prompt_cache_key",
    "safety_identifier",
    "service_tier",
    "top_logprobs",
)


@dataclass(frozen=True)
class Flat:
    """What a chat function name stands for."""

    kind: str  # function | custom | tool_search
    name: str
    namespace: str | None = None


@dataclass
class Tools:
    """The request's tools by their chat names, to restore the calls in the answer."""

    by_flat: dict[str, Flat] = field(default_factory=dict)

    def flat(self, kind: str, name: str, namespace: str | None = None) -> str:
        flat = f"{namespace}{SEP}{name}" if namespace else name
        self.by_flat.setdefault(flat, Flat(kind, name, namespace))
        return flat

    def restore(self, flat: str) -> Flat:
        return self.by_flat.get(flat) or Flat("function", flat)


# -- request ---------------------------------------------------------------------------


def to_chat(body: dict[str, Any]) -> tuple[dict[str, Any], Tools]:
    """The chat completions body for a Responses body, and its tool table."""
    tools = Tools()
    chat: dict[str, Any] = {"model": body.get("model")}
    declared = [t for t in (body.get("tools") or []) if isinstance(t, dict)]
    functions = list(_chat_tools(declared, tools))
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        messages.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
    elif isinstance(items, list):
        messages += _messages(items, tools, functions)
    chat["messages"] = messages
    if functions:
        chat["tools"] = functions
        choice = _tool_choice(body.get("tool_choice"), tools)
        if choice is not None:
            chat["tool_choice"] = choice
    for name in _SAME:
        if name in body:
            chat[name] = body[name]
    if isinstance(body.get("max_output_tokens"), int):
        chat["max_tokens"] = body["max_output_tokens"]
    effort = (body.get("reasoning") or {}).get("effort")
    if isinstance(effort, str):
        chat["reasoning_effort"] = effort
    fmt = (body.get("text") or {}).get("format")
    if isinstance(fmt, dict) and fmt.get("type") in ("json_schema", "json_object"):
        chat["response_format"] = _response_format(fmt)
    if body.get("stream") is True:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat, tools


def _chat_tools(declared: Iterable[dict[str, Any]], tools: Tools) -> Iterable[dict[str, Any]]:
    for tool in declared:
        kind = tool.get("type")
        if kind == "function":
            yield _function(tools.flat("function", str(tool.get("name"))), tool)
        elif kind == "namespace":
            ns = str(tool.get("name"))
            for inner in tool.get("tools") or []:
                if isinstance(inner, dict) and inner.get("type") == "function":
                    yield _function(tools.flat("function", str(inner.get("name")), ns), inner)
        elif kind == "custom":
            yield _custom(tools.flat("custom", str(tool.get("name"))), tool)
        elif kind == "tool_search":
            params = tool.get("parameters") or {
                "type": "object",
                "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["query"],
            }
            yield _function(
                tools.flat("tool_search", "tool_search"),
                {
                    "description": tool.get("description", "Search for more tools."),
                    "parameters": params,
                },
            )


def _function(name: str, tool: dict[str, Any]) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": name}
    for key in ("description", "parameters", "strict"):
        if tool.get(key) is not None:
            fn[key] = tool[key]
    return {"type": "function", "function": fn}


def _custom(name: str, tool: dict[str, Any]) -> dict[str, Any]:
    """A freeform tool as a function of one string, its grammar said in words."""
    description = str(tool.get("description") or "")
    fmt = tool.get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "grammar":
        description += (
            f"\n\nThe `input` argument is the tool's raw input; it must follow this "
            f"{fmt.get('syntax', '')} grammar:\n{fmt.get('definition', '')}"
        )
    else:
        description += "\n\nThe `input` argument is the tool's raw input, as free text."
    params = {
        "type": "object",
        "properties": {"input": {"type": "string"}},
        "required": ["input"],
        "additionalProperties": False,
    }
    return {
        "type": "function",
        "function": {"name": name, "description": description.strip(), "parameters": params},
    }


def _tool_choice(choice: Any, tools: Tools) -> Any:
    if isinstance(choice, str):
        return choice if choice in ("auto", "none", "required") else None
    if isinstance(choice, dict) and isinstance(choice.get("name"), str):
        name, namespace = choice["name"], choice.get("namespace")
        if choice.get("type") == "custom":
            flat = tools.flat("custom", name)
        elif namespace is None and name not in tools.by_flat:
            # a namespaced tool named without its namespace: the one declared by that name
            flat = next((f for f, t in tools.by_flat.items() if t.name == name), name)
        else:
            flat = tools.flat("function", name, namespace)
        return {"type": "function", "function": {"name": flat}}
    return None


def _response_format(fmt: dict[str, Any]) -> dict[str, Any]:
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
    return {"type": "json_schema", "json_schema": schema}


def _messages(
    items: list[Any], tools: Tools, functions: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            out.append(_message(item))
        elif kind in _CALLS:
            call = _call(item, tools)
            last = out[-1] if out else None  # an assistant turn not yet answered takes more
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind in _OUTPUTS:
            out.append(_output(item, tools, functions))
    return out


def _message(item: dict[str, Any]) -> dict[str, Any]:
    role = item.get("role", "user")
    role = "system" if role == "developer" else role
    content = item.get("content")
    if isinstance(content, list):
        parts = [q for q in (_part(p) for p in content if isinstance(p, dict)) if q is not None]
        if all(p["type"] == "text" for p in parts):
            content = "".join(p["text"] for p in parts)
        else:
            content = parts
    return {"role": role, "content": content}


def _part(part: dict[str, Any]) -> dict[str, Any] | None:
    kind = part.get("type")
    if kind in ("input_text", "output_text", "text", "refusal"):
        return {"type": "text", "text": str(part.get("text") or part.get("refusal") or "")}
    if kind == "input_image" and part.get("image_url"):
        return {"type": "image_url", "image_url": {"url": part["image_url"]}}
    return None


def _call(item: dict[str, Any], tools: Tools) -> dict[str, Any]:
    kind = item["type"]
    if kind == "custom_tool_call":
        name = tools.flat("custom", str(item.get("name")))
        arguments = orjson.dumps({"input": item.get("input", "")}).decode()
    elif kind == "tool_search_call":
        name = tools.flat("tool_search", "tool_search")
        arguments = orjson.dumps(item.get("arguments") or {}).decode()
    else:
        name = tools.flat("function", str(item.get("name")), item.get("namespace"))
        arguments = str(item.get("arguments") or "")
    call_id = str(item.get("call_id") or item.get("id") or "")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _output(item: dict[str, Any], tools: Tools, functions: list[dict[str, Any]]) -> dict[str, Any]:
    if item["type"] == "tool_search_output":
        loaded = [t for t in (item.get("tools") or []) if isinstance(t, dict)]
        known = {f["function"]["name"] for f in functions}
        for tool in _chat_tools(loaded, tools):
            if tool["function"]["name"] not in known:
                functions.append(tool)
        text = orjson.dumps({"loaded_tools": [t["function"]["name"] for t in functions]}).decode()
    else:
        text = _output_text(item.get("output"))
    return {"role": "tool", "tool_call_id": str(item.get("call_id") or ""), "content": text}


def _output_text(output: Any) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return "".join(
            str(p.get("text", "")) for p in output if isinstance(p, dict) and "text" in p
        )
    if isinstance(output, dict) and "content" in output:
        return str(output["content"])
    return orjson.dumps(output).decode()


# -- answer ----------------------------------------------------------------------------


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def call_item(flat: Flat, call_id: str, arguments: str) -> dict[str, Any]:
    """The Responses output item for a chat tool call, as the client declared the tool."""
    if flat.kind == "custom":
        try:
            parsed = orjson.loads(arguments)
            raw = parsed.get("input") if isinstance(parsed, dict) else None
        except orjson.JSONDecodeError:
            raw = None
        return {
            "type": "custom_tool_call",
            "id": new_id("ctc"),
            "status": "completed",
            "call_id": call_id,
            "name": flat.name,
            "input": raw if isinstance(raw, str) else arguments,
        }
    if flat.kind == "tool_search":
        try:
            args = orjson.loads(arguments or "{}")
        except orjson.JSONDecodeError:
            args = {"query": arguments}
        return {
            "type": "tool_search_call",
            "id": new_id("tsc"),
            "status": "completed",
            "call_id": call_id,
            "execution": "client",
            "arguments": args,
        }
    item = {
        "type": "function_call",
        "id": new_id("fc"),
        "status": "completed",
        "call_id": call_id,
        "name": flat.name,
        "arguments": arguments,
    }
    if flat.namespace:
        item["namespace"] = flat.namespace
    return item


def message_item(text: str, item_id: str | None = None) -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id or new_id("msg"),
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def usage_of(chat_usage: Any) -> dict[str, Any] | None:
    if not isinstance(chat_usage, dict):
        return None
    prompt = int(chat_usage.get("prompt_tokens") or 0)
    completion = int(chat_usage.get("completion_tokens") or 0)
    details = chat_usage.get("prompt_tokens_details") or {}
    reasoning = (chat_usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": int(details.get("cached_tokens") or 0)},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": int(reasoning)},
        "total_tokens": prompt + completion,
    }


def response(
    body: dict[str, Any],
    response_id: str,
    model: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    status: str,
) -> dict[str, Any]:
    """A Response object, echoing the request's settings as OpenAI's does."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": model,
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "reasoning": body.get("reasoning"),
        "store": False,
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "usage": usage,
        "metadata": body.get("metadata") or {},
    }


def to_response(body: dict[str, Any], tools: Tools, chat: dict[str, Any]) -> dict[str, Any]:
    """The Response for a (non-streamed) chat completion."""
    choices = chat.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") or {}
    output: list[dict[str, Any]] = []
    if isinstance(message.get("content"), str) and message["content"]:
        output.append(message_item(message["content"]))
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        flat = tools.restore(str(fn.get("name", "")))
        output.append(
            call_item(flat, str(call.get("id") or new_id("call")), str(fn.get("arguments") or ""))
        )
    status = "incomplete" if choice.get("finish_reason") == "length" else "completed"
    model = str(chat.get("model") or body.get("model") or "")
    return response(body, new_id("resp"), model, output, usage_of(chat.get("usage")), status)
