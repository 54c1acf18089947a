"""Settings still accepted but no longer read, and the one warning each gets.

A configuration written for an earlier version keeps loading (the seed files included);
each deprecated setting it sets is named once per process, when the process takes its
configuration (`app.bootstrap.setup_process`, once the log is open), with what replaced
it. A reload that sets one reports it as having no effect (`app.config.effects`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from app.config.schema import Settings

log = logging.getLogger("tokengate.config")


@dataclass(frozen=True)
class Deprecated:
    path: str
    set_in: Callable[[Settings], object]  # the value when the operator set it, else None
    instead: str


def _database(settings: Settings) -> str:
    if settings.database.url is not None:
        return "database.url (PostgreSQL)"
    return f"database.path ({settings.database.path})"


DEPRECATED = (
    Deprecated(
        "server.upstream_client",
        lambda s: s.server.upstream_client if s.server.upstream_client != "aiohttp" else None,
        "the upstream client is aiohttp",
    ),
    Deprecated(
        "ledger.path",
        lambda s: s.ledger.path,
        "the ledger, batches and files live in one database",
    ),
    Deprecated(
        "batch.path",
        lambda s: s.batch.path,
        "the ledger, batches and files live in one database",
    ),
    Deprecated(
        "logging.log_prompts",
        lambda s: s.logging.log_prompts or None,
        "prompt text is never written to the log",
    ),
)


def deprecations(settings: Settings) -> list[str]:
    """One line per deprecated setting this configuration sets."""
    notes = []
    for item in DEPRECATED:
        value = item.set_in(settings)
        if value is None:
            continue
        instead = item.instead
        if item.path in ("ledger.path", "batch.path"):
            instead += f": {_database(settings)}"
        notes.append(f"{item.path} = {value!r} is deprecated and ignored: {instead}")
    return notes


def warn_deprecated(settings: Settings) -> None:
    for note in deprecations(settings):
        log.warning("%s", note)
