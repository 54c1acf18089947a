"""Responses onto chat completions and back (`responses = "chat"`): Codex's tool types
(function, namespace, custom, tool_search) survive both directions, streamed and not,
with history adjacency kept."""

from __future__ import annotations

from typing import Any

import orjson

from app.upstream.responses_chat import to_chat, to_response
from app.upstream.responses_chat_stream import ChatStream

GRAMMAR = 'start: "*** Begin Patch" LF hunk* "*** End Patch"'
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "exec_command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    },
    {
        "type": "namespace",
        "name": "mcp__docs",
        "description": "the docs server",
        "tools": [{"type": "function", "name": "search", "parameters": {"type": "object"}}],
    },
    {
        "type": "custom",
        "name": "apply_patch",
        "description": "Edit files.",
        "format": {"type": "grammar", "syntax": "lark", "definition": GRAMMAR},
    },
    {
        "type": "tool_search",
        "execution": "client",
        "description": "Find deferred tools.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
    },
    {"type": "web_search"},  # hosted: no chat form
]
PATCH = "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch"


def body(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "instructions": "be brief", "input": "hi", "tools": TOOLS, **extra}


def names(chat: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in chat["tools"]]


def test_every_tool_type_is_flattened_onto_chat_functions() -> None:
    chat, _ = to_chat(body(tool_choice={"type": "custom", "name": "apply_patch"}))
    assert names(chat) == ["exec_command", "mcp__docs__search", "apply_patch", "tool_search"]
    custom = chat["tools"][2]["function"]
    assert custom["parameters"]["required"] == ["input"]
    assert GRAMMAR in custom["description"] and "lark" in custom["description"]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "apply_patch"}}
    assert chat["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]


def test_request_fields_map_and_streams_ask_for_usage() -> None:
    chat, _ = to_chat(
        body(
            stream=True,
            max_output_tokens=50,
            reasoning={"effort": "low", "summary": "auto"},
            prompt_cache_key="thread-1",
            text={"format": {"type": "json_schema", "name": "x", "schema": {}}},
        )
    )
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}
    assert chat["max_tokens"] == 50 and chat["reasoning_effort"] == "low"
    assert chat["prompt_cache_key"] == "thread-1"
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": {}},
    }


def history() -> list[dict[str, Any]]:
    """A Codex conversation using every kind of call, in the order Codex keeps it."""
    return [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "rules"}],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "e"},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "ok"}],
        },
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "exec_command",
            "arguments": '{"cmd":"ls"}',
        },
        {
            "type": "function_call",
            "call_id": "c2",
            "name": "search",
            "namespace": "mcp__docs",
            "arguments": "{}",
        },
        {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
        {
            "type": "function_call_output",
            "call_id": "c2",
            "output": [{"type": "input_text", "text": "doc"}],
        },
        {"type": "custom_tool_call", "call_id": "c3", "name": "apply_patch", "input": PATCH},
        {"type": "custom_tool_call_output", "call_id": "c3", "output": "Done"},
        {
            "type": "tool_search_call",
            "call_id": "c4",
            "execution": "client",
            "arguments": {"query": "calendar"},
        },
        {
            "type": "tool_search_output",
            "call_id": "c4",
            "execution": "client",
            "status": "completed",
            "tools": [
                {"type": "function", "name": "create_event", "parameters": {"type": "object"}}
            ],
        },
    ]


def test_history_keeps_adjacency_calls_then_their_outputs() -> None:
    chat, _ = to_chat(body(input=history()))
    roles = [(m["role"], [c["id"] for c in m.get("tool_calls", [])]) for m in chat["messages"]]
    assert roles == [
        ("system", []),
        ("system", []),
        ("user", []),
        ("assistant", ["c1", "c2"]),  # the text and both parallel calls: one assistant turn
        ("tool", []),
        ("tool", []),
        ("assistant", ["c3"]),
        ("tool", []),
        ("assistant", ["c4"]),
        ("tool", []),
    ]
    msgs = chat["messages"]
    assert msgs[3]["content"] == "ok"
    assert [m.get("tool_call_id") for m in msgs[4:6]] == ["c1", "c2"]
    assert msgs[5]["content"] == "doc"
    patch_call = msgs[6]["tool_calls"][0]["function"]
    assert patch_call["name"] == "apply_patch"
    assert orjson.loads(patch_call["arguments"]) == {"input": PATCH}
    assert msgs[4 + 3]["content"] == "Done"
    assert msgs[6 + 2]["tool_calls"][0]["function"]["name"] == "tool_search"
    assert msgs[3]["tool_calls"][1]["function"]["name"] == "mcp__docs__search"
    # the tools a tool_search loaded are offered from then on
    assert "create_event" in names(chat)


def chat_answer(content: str | None, calls: list[tuple[str, str, str]]) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "model": "m-2026",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls" if calls else "stop",
                "message": {
                    "role": "assistant",
                    "content": content,
                    "tool_calls": [
                        {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                        for i, n, a in calls
                    ],
                },
            }
        ],
        "usage": {
            "prompt_tokens": 10,
            "completion_tokens": 5,
            "prompt_tokens_details": {"cached_tokens": 4},
        },
    }


CALLS = [
    ("c1", "exec_command", '{"cmd":"ls"}'),
    ("c2", "mcp__docs__search", '{"q":"x"}'),
    ("c3", "apply_patch", orjson.dumps({"input": PATCH}).decode()),
    ("c4", "tool_search", '{"query":"calendar","limit":2}'),
]


def expected_items() -> list[dict[str, Any]]:
    return [
        {"type": "message", "text": "thinking aloud"},
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "exec_command",
            "arguments": '{"cmd":"ls"}',
        },
        {
            "type": "function_call",
            "call_id": "c2",
            "name": "search",
            "namespace": "mcp__docs",
            "arguments": '{"q":"x"}',
        },
        {"type": "custom_tool_call", "call_id": "c3", "name": "apply_patch", "input": PATCH},
        {
            "type": "tool_search_call",
            "call_id": "c4",
            "execution": "client",
            "arguments": {"query": "calendar", "limit": 2},
        },
    ]


def essentials(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for item in items:
        if item["type"] == "message":
            out.append({"type": "message", "text": item["content"][0]["text"]})
        else:
            out.append({k: v for k, v in item.items() if k not in ("id", "status")})
    return out


def test_a_chat_answer_is_restored_to_the_declared_tool_types() -> None:
    request = body()
    _, tools = to_chat(request)
    answer = to_response(request, tools, chat_answer("thinking aloud", CALLS))
    assert answer["object"] == "response" and answer["status"] == "completed"
    assert essentials(answer["output"]) == expected_items()
    assert answer["usage"] == {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": 4},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 15,
    }
    assert answer["tools"] == TOOLS and answer["model"] == "m-2026"


def test_restored_items_sent_back_give_the_upstream_the_same_calls() -> None:
    request = body()
    _, tools = to_chat(request)
    answer = to_response(request, tools, chat_answer("thinking aloud", CALLS))
    outputs = [
        {"type": "function_call_output", "call_id": "c1", "output": "x"},
        {"type": "function_call_output", "call_id": "c2", "output": "x"},
        {"type": "custom_tool_call_output", "call_id": "c3", "output": "x"},
        {"type": "tool_search_output", "call_id": "c4", "execution": "client", "tools": []},
    ]
    chat, _ = to_chat(body(input=["go", *answer["output"], *outputs][1:]))
    (turn,) = [m for m in chat["messages"] if m.get("tool_calls")]
    assert [(c["id"], c["function"]["name"]) for c in turn["tool_calls"]] == [
        (i, n) for i, n, _ in CALLS
    ]
    assert orjson.loads(turn["tool_calls"][2]["function"]["arguments"]) == {"input": PATCH}
    assert turn["content"] == "thinking aloud"


def test_length_is_incomplete() -> None:
    chat = chat_answer("cut", [])
    chat["choices"][0]["finish_reason"] = "length"
    answer = to_response(body(), to_chat(body())[1], chat)
    assert answer["status"] == "incomplete"
    assert answer["incomplete_details"] == {"reason": "max_output_tokens"}


# -- streamed -----------------------------------------------------------------------------


def sse(*chunks: dict[str, Any]) -> list[bytes]:
    return [b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks] + [b"data: [DONE]\n\n"]


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "c",
        "model": "m-2026",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def tool_delta(index: int, call_id: str | None, name: str | None, args: str) -> dict[str, Any]:
    fn: dict[str, Any] = {"arguments": args}
    if name:
        fn["name"] = name
    delta: dict[str, Any] = {"index": index, "function": fn}
    if call_id:
        delta.update(id=call_id, type="function")
    return delta


def stream_chunks() -> list[bytes]:
    pieces = [chunk({"role": "assistant", "content": "thinking "}), chunk({"content": "aloud"})]
    for n, (call_id, name, args) in enumerate(CALLS):
        half = len(args) // 2
        pieces.append(chunk({"tool_calls": [tool_delta(n, call_id, name, args[:half])]}))
        pieces.append(chunk({"tool_calls": [tool_delta(n, None, None, args[half:])]}))
    pieces.append(chunk({}, "tool_calls"))
    usage = {"prompt_tokens": 10, "completion_tokens": 5}
    pieces.append({"id": "c", "model": "m-2026", "choices": [], "usage": usage})
    raw = b"".join(sse(*pieces))
    return [raw[i : i + 37] for i in range(0, len(raw), 37)]  # split anywhere


def events(stream: ChatStream, chunks: list[bytes]) -> list[dict[str, Any]]:
    out = b"".join(stream.feed(c) for c in chunks)
    return [orjson.loads(e.split(b"data: ", 1)[1]) for e in out.split(b"\n\n") if e]


def test_a_chat_stream_becomes_the_responses_events_with_every_tool_type() -> None:
    request = body(stream=True)
    _, tools = to_chat(request)
    got = events(ChatStream(request, tools), stream_chunks())
    kinds = [e["type"] for e in got]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [e["sequence_number"] for e in got] == list(range(len(got)))
    final = got[-1]["response"]
    assert essentials(final["output"]) == expected_items()
    assert final["usage"]["input_tokens"] == 10 and final["usage"]["output_tokens"] == 5
    text = "".join(e["delta"] for e in got if e["type"] == "response.output_text.delta")
    assert text == "thinking aloud"
    args = "".join(e["delta"] for e in got if e["type"] == "response.function_call_arguments.delta")
    assert args == '{"cmd":"ls"}{"q":"x"}'
    (custom,) = [e for e in got if e["type"] == "response.custom_tool_call_input.done"]
    assert custom["input"] == PATCH
    done = [e["item"] for e in got if e["type"] == "response.output_item.done"]
    assert essentials(done) == expected_items()
    added = [e["output_index"] for e in got if e["type"] == "response.output_item.added"]
    assert sorted(added) == [0, 1, 2, 3, 4]
    # every item's events name the item the done event names
    ids = {e["item"]["id"] for e in got if e["type"] == "response.output_item.added"}
    assert ids == {i["id"] for i in done}


def test_a_stream_cut_before_its_end_gets_no_terminal_event_here() -> None:
    request = body(stream=True)
    _, tools = to_chat(request)
    cut = b"".join(stream_chunks())[:200]
    got = events(ChatStream(request, tools), [cut])
    assert got and not any(e["type"].startswith("response.complete") for e in got)


def test_a_hostile_upstream_cannot_grow_the_held_event_without_bound() -> None:
    request = body(stream=True)
    stream = ChatStream(request, to_chat(request)[1])
    for _ in range(6):
        stream.feed(b"data: " + b"x" * (1024 * 1024))  # no event separator, ever
    assert len(stream._reader._buffer) <= 4 * 1024 * 1024
    out = stream.feed(b"\n\n" + b"".join(stream_chunks()))  # the stream goes on afterwards
    assert b"response.completed" in out
    assert stream.feed(b"data: {not json}\n\ndata: [1,2]\n\n") == b""  # garbage is skipped
