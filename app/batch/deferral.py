"""Holding deferred work (Batch API jobs, deferred background responses) for an
off-peak billing window.

A batch (or a held response, stored as a one-item batch: `held.py`) is held (its items
stay pending in the database, so a restart or another replica
finds it held just the same) while `batch.defer_window` is not in force, and released:

    in the window           `released`; its items then go at the pace the domain's quota
                            allows, in the `batch` class, behind interactive traffic
    before it, early        `early_released`, when waiting would leave less than its
                            pending items need (`item_estimate_sec` per item per slot of
                            `batch.concurrency`, plus `defer_margin_sec`) before its
                            `completion_window` ends

The decision is pure (`decide`); the batch carries it in `tokengate_deferral` (the window,
since when it is held, when it will run, when it was released and whether early), which
`GET /v1/batches/{id}`, `/admin/status` and the status page show.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, NamedTuple

from app.billing.timetable import Timetable
from app.config.schema import Settings


class DeferDecision(NamedTuple):
    hold: bool
    window: str | None
    release_at: float | None  # when the window begins (None: in force, or never)
    early: bool = False


def defer_window(
    settings: Settings, key_choice: str | None = None, domain: str | None = None
) -> str | None:
    """The window deferred work waits for: its key's choice, else its domain's
    (`[[scale_up]] defer_window`), else `batch.defer_window`; None: it waits for nothing
    (idle upstream quota, the batch class)."""
    name = key_choice
    if name is None:
        name = domain_choice(settings, domain)
    if name is None:
        name = settings.batch.defer_window
    windows = settings.billing.windows
    if name == "auto":
        return "offpeak" if "offpeak" in windows else None
    if name in (None, "none") or name not in windows:
        return None
    return name


def domain_choice(settings: Settings, domain: str | None) -> str | None:
    """`defer_window` of domain `domain` (None: unnamed, unknown or unset). A gateway of one
    domain applies that domain's to all deferred work."""
    raw = settings.scale_up
    domains = [] if raw is None else raw if isinstance(raw, list) else [raw]
    for d in domains:
        if d.domain == domain or (domain is None and len(domains) == 1):
            return d.defer_window
    return None


def decide(
    timetable: Timetable,
    window: str | None,
    now: float,
    expires_at: float,
    pending: int,
    per_item_sec: float,
    concurrency: int,
    margin: float,
) -> DeferDecision:
    if window is None or timetable.at(now) == window:
        return DeferDecision(False, window, None)
    starts = timetable.next_start(window, now)
    needed = pending * per_item_sec / max(1, concurrency) + margin
    if starts is None or starts + needed > expires_at:
        return DeferDecision(False, window, starts, early=True)
    return DeferDecision(True, window, starts)


def note(batch: dict[str, Any], decision: DeferDecision, now: float) -> bool:
    """Record the decision in the batch's `tokengate_deferral`; True if it changed (the
    batch is to be saved, and a held/released/early_released counted)."""
    info = batch.get("tokengate_deferral")
    if decision.hold:
        if info is not None:
            return False
        batch["tokengate_deferral"] = {
            "window": decision.window,
            "held_since": int(now),
            "release_at": _iso(decision.release_at),
            "released_at": None,
            "early": False,
        }
        return True
    if info is None:
        if not decision.early:
            return False  # in the window at once: nothing was held
        info = batch["tokengate_deferral"] = {
            "window": decision.window,
            "held_since": None,
            "release_at": _iso(decision.release_at),
        }
    elif info.get("released_at") is not None:
        return False
    info["released_at"] = int(now)
    info["early"] = decision.early
    return True


def _iso(at: float | None) -> str | None:
    return None if at is None else datetime.fromtimestamp(at, UTC).isoformat()
