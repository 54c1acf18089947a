"""The error the CLI reports for a database it can not use (kept apart from SQLAlchemy,
so `tokengate` starts without importing it)."""

from __future__ import annotations


class DatabaseProblem(Exception):
    """The database can not be used as configured; the CLI prints it and exits 2."""

    exit_code = 2

    def render(self) -> str:
        return f"tokengate: {self}"
