"""Which tool the simulator's Responses API calls, for every tool type Codex declares.

Codex CLI sends function tools, `namespace` tools (an MCP server: a namespace holding
function tools), `custom` tools (freeform input, `apply_patch` with a Lark grammar) and a
client-executed `tool_search`. The simulator answers each as OpenAI's API does:

    function f            ► function_call {name: f, arguments}
    namespace ns { f }    ► function_call {name: f, namespace: ns, arguments}
    custom c              ► custom_tool_call {name: c, input}
    tool_search           ► tool_search_call {execution: "client", arguments: {query, limit}}

Which one: the rule of `tools.py` (forced by `tool_choice`, else named in the user's last
text, else the first, `--tool-calls named` calling only the first two), over the tools
in declaration order, a namespace's tools in its place. A conversation whose last item
is any tool's output is answered with text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.sim.tools import Tool, ToolMode, named

CALLS = frozenset({"function_call", "custom_tool_call", "tool_search_call"})
OUTPUTS = frozenset({"function_call_output", "custom_tool_call_output", "tool_search_output"})


@dataclass(frozen=True)
class Offered:
    kind: str  # function | custom | tool_search
    tool: dict[str, Any]
    namespace: str | None = None

    @property
    def name(self) -> str:
        return "tool_search" if self.kind == "tool_search" else str(self.tool.get("name"))


def callables(body: dict[str, Any]) -> list[Offered]:
    out: list[Offered] = []
    for tool in body.get("tools") or []:
        if not isinstance(tool, dict):
            continue
        kind = tool.get("type")
        if kind in ("function", "custom", "tool_search"):
            out.append(Offered(str(kind), tool))
        elif kind == "namespace":
            out += [
                Offered("function", inner, str(tool.get("name")))
                for inner in tool.get("tools") or []
                if isinstance(inner, dict) and inner.get("type") == "function"
            ]
    return out


def to_call(
    body: dict[str, Any], items: list[dict[str, Any]], mode: ToolMode, prompt: str
) -> Offered | None:
    """The tool to call now; None: answer with text."""
    tools = callables(body)
    choice = body.get("tool_choice", "auto")
    if not tools or choice == "none":
        return None
    if items and items[-1].get("type") in OUTPUTS:
        return None  # the tool ran: now answer
    if isinstance(choice, dict) and isinstance(choice.get("name"), str):
        return next((t for t in tools if t.name == choice["name"]), tools[0])
    if mode == "auto" or choice == "required":
        return tools[0]
    found = named([Tool(t.name, {}) for t in tools], prompt)
    return next((t for t in tools if found and t.name == found.name), None)


def check_outputs(context: list[Any], items: list[dict[str, Any]]) -> str | None:
    """What is wrong with the tool outputs of `items` (None: each answers an earlier
    call), as the real API checks and as catches a gateway that lost items."""
    calls = {i.get("call_id") for i in context if isinstance(i, dict) and i.get("type") in CALLS}
    for n, item in enumerate(items):
        if item.get("type") in CALLS:
            calls.add(item.get("call_id"))
        elif item.get("type") in OUTPUTS and item.get("call_id") not in calls:
            return (
                f"No tool call found for {item['type'].removesuffix('_output').replace('_', ' ')}"
                f" output with call_id {item.get('call_id')!r} (input[{n}])."
            )
    return None
