"""`model_aliases`: client-facing model names to upstream ids, exact names and patterns.

A key holding `*`, `?` or `[` is a shell-style pattern (`"claude-*"`), for clients that
pick their own model ids and change them with each release (Claude Code asks for its
newest default model unless told otherwise). Resolution, in order:

1. an exact alias;
2. the name itself, when some domain lists it (a pattern never hides a served model);
3. the most specific matching pattern (the longest one; the first listed on a tie);
4. the name unchanged (routing then answers 404 if nothing serves it).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from fnmatch import translate

_PATTERN = re.compile(r"[*?\[]")


def is_pattern(name: str) -> bool:
    return _PATTERN.search(name) is not None


class Aliases:
    def __init__(self, table: Mapping[str, str]) -> None:
        self.exact = {k: v for k, v in table.items() if not is_pattern(k)}
        ordered = sorted(
            (k for k in table if is_pattern(k)), key=lambda k: -len(k)
        )  # stable: ties keep the configured order
        self.patterns = [(re.compile(translate(k)), table[k]) for k in ordered]

    def resolve(self, name: str, listed: Callable[[str], bool] = lambda _: False) -> str:
        target = self.exact.get(name)
        if target is not None:
            return target
        if not self.patterns or listed(name):
            return name
        for pattern, target in self.patterns:
            if pattern.match(name):
                return target
        return name
