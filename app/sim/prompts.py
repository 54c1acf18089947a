"""What the simulator reads of a chat or Messages prompt: its tokens, its cache segments,
its tools and where the conversation stands (a tool call pending an answer or not).

    chat      tools: [{"type": "function", "function": {name, parameters}}]
              tool_choice: "none" | "auto" | "required" | {"function": {"name"}}
              a tool's result: a message with role "tool"
    messages  tools: [{name, input_schema}]   system: str | [blocks]
              tool_choice: {"type": "auto" | "any" | "tool" | "none", "name"}
              a tool's result: a user message holding a `tool_result` block
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.sim import text
from app.sim.cache import Rule, Segment, has_breakpoint
from app.sim.tools import Tool, ToolMode, named


@dataclass(frozen=True)
class Prompt:
    tokens: int
    segments: list[Segment]
    rule: Rule
    tools: list[Tool] = field(default_factory=list)
    forced: str | None = None  # the tool the request names
    tools_allowed: bool = True
    required: bool = False  # tool_choice demands a call (required, any, a named tool)
    answered: bool = False  # the last message is a tool's result: answer in text
    last_user_text: str = ""

    def wants_tool(self, mode: ToolMode = "auto") -> bool:
        """A call when tools are offered and allowed and no result is pending; with mode
        `named`, only if the request demands one or the user's last text names one."""
        if not self.tools or not self.tools_allowed or self.answered:
            return False
        if mode == "auto":
            return True
        return self.required or named(self.tools, self.last_user_text) is not None


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _schema(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def chat(body: dict[str, Any], messages: list[dict[str, Any]]) -> Prompt:
    raw_tools = _list(body.get("tools"))
    tools = [
        Tool(str(f.get("name")), _schema(f.get("parameters")))
        for t in raw_tools
        if isinstance(t, dict) and isinstance(f := t.get("function"), dict) and f.get("name")
    ]
    choice = body.get("tool_choice")
    forced = None
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        forced = choice["function"].get("name")
    segments = [Segment(raw_tools, text.value_tokens(raw_tools))] if raw_tools else []
    segments += [Segment(m, text.message_tokens(m)) for m in messages]
    return Prompt(
        tokens=sum(s.tokens for s in segments),
        segments=segments,
        rule=Rule.AUTOMATIC,
        tools=tools,
        forced=forced if isinstance(forced, str) else None,
        tools_allowed=choice != "none",
        required=choice == "required" or forced is not None,
        answered=messages[-1].get("role") == "tool",
        last_user_text=_last_user_text(messages),
    )


def messages(body: dict[str, Any], msgs: list[dict[str, Any]]) -> Prompt:
    raw_tools = _list(body.get("tools"))
    tools = [
        Tool(str(t["name"]), _schema(t.get("input_schema")))
        for t in raw_tools
        if isinstance(t, dict) and t.get("name")
    ]
    choice = body.get("tool_choice")
    kind = choice.get("type") if isinstance(choice, dict) else None
    forced = choice.get("name") if isinstance(choice, dict) and kind == "tool" else None
    system = body.get("system")
    segments = []
    if raw_tools:
        segments.append(Segment(raw_tools, text.value_tokens(raw_tools), has_breakpoint(raw_tools)))
    if system:
        segments.append(Segment(system, text.value_tokens(system), has_breakpoint(system)))
    segments += [Segment(m, text.message_tokens(m), has_breakpoint(m)) for m in msgs]
    last = msgs[-1]
    return Prompt(
        tokens=sum(s.tokens for s in segments),
        segments=segments,
        rule=Rule.BREAKPOINTS,
        tools=tools,
        forced=forced if isinstance(forced, str) else None,
        tools_allowed=kind != "none",
        required=kind in ("any", "tool"),
        answered=last.get("role") == "user" and _holds_tool_result(last.get("content")),
        last_user_text=_last_user_text(msgs),
    )


def _holds_tool_result(content: Any) -> bool:
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content
    )


def _last_user_text(msgs: list[dict[str, Any]]) -> str:
    """The last text the user typed: the last text block of the last user message (an
    agent puts its reminders in earlier blocks of the same message)."""
    for m in reversed(msgs):
        if m.get("role") != "user":
            continue
        content = m.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            texts = [b.get("text") for b in content if isinstance(b, dict)]
            strings = [t for t in texts if isinstance(t, str)]
            if strings:
                return strings[-1]
    return ""
