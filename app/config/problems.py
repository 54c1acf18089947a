"""Configuration problems, rendered as one message an operator can act on."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    origin: str  # file path or "environment variable X"
    field: str
    message: str
    fix: str

    def render(self) -> str:
        return f"  {self.origin}: {self.field}: {self.message}. Fix: {self.fix}."


class ConfigError(Exception):
    """Raised for any invalid configuration; the CLI prints it and exits with code 2."""

    exit_code = 2

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__(self.render())

    def render(self) -> str:
        head = "tokengate: invalid configuration"
        return "\n".join([head, *(p.render() for p in self.problems)])
