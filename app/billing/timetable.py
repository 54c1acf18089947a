"""Billing windows: which named window of `billing.windows` holds an instant, and when
that changes. Pure: every function takes the instant (epoch seconds); nothing reads a
clock.

A window is a set of minutes of the local week (`WindowConfig.spans`), read on the wall
clock of `billing.timezone`:

    at(t)           the window whose minutes hold t's local weekday and minute, else None
    next_change(t)  the first instant after t at which `at` answers something else
    ahead(t, s)     every window in force at some instant of [t, t + s] (a budget's hold
                    covers the dearest of them: the request is priced when it is served)

A DST change moves the wall clock, so on the wall clock's terms: a window ending at 02:30
on the night clocks go from 02:00 to 03:00 ends at 03:00 (02:30 never happens); in the
hour that happens twice when clocks go back, a time inside a window is inside it both
times. `next_change` walks candidate instants in order, which are every boundary's wall
time on the coming days (both readings of a repeated time) and every offset change, so it
is exact whatever the zone does.

On the request path `Timetable.name_at` answers from the current stretch (the window in
force and the instant it ends): two comparisons, and the arithmetic once per change.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import date, datetime, time, timedelta
from typing import NamedTuple
from zoneinfo import ZoneInfo

from app.config.billing import DAY_MINUTES, WEEK_MINUTES, WindowConfig

NO_WINDOW = "-"  # the ledger's window of a request priced outside every window
_HORIZON_DAYS = 8  # every window recurs within a week: a change, if any, is this close


class WindowChange(NamedTuple):
    at: float  # epoch seconds
    window: str | None  # the window from then on (None: none)


class Timetable:
    def __init__(self, windows: Mapping[str, WindowConfig], timezone: str = "UTC") -> None:
        self.zone = ZoneInfo(timezone)
        self.names = tuple(windows)
        self._week: list[str | None] = [None] * WEEK_MINUTES
        clocks: set[int] = set()
        for name, window in windows.items():
            for first, after in window.spans():
                for minute in range(first, after):
                    self._week[minute % WEEK_MINUTES] = name
                clocks.update((first % DAY_MINUTES, after % DAY_MINUTES))
        self._clocks = sorted(clocks)  # minutes of the day at which some window begins or ends
        self._stretch: tuple[float, float, str | None] = (math.inf, -math.inf, None)

    def __bool__(self) -> bool:
        return bool(self.names)

    def at(self, t: float) -> str | None:
        local = datetime.fromtimestamp(t, self.zone)
        return self._week[local.weekday() * DAY_MINUTES + local.hour * 60 + local.minute]

    def next_change(self, t: float) -> WindowChange | None:
        """None: the same window (or none) for ever (no windows, or one covering all week)."""
        now = self.at(t)
        for candidate in self._candidates(t):
            found = self.at(candidate)
            if found != now:
                return WindowChange(candidate, found)
        return None

    def next_start(self, name: str, t: float) -> float | None:
        """When window `name` next begins after `t` (None: never, or it holds for ever)."""
        at = t
        for _ in range(4 * len(self.names) + 8):  # a week has that many changes at most
            change = self.next_change(at)
            if change is None:
                return None
            if change.window == name:
                return change.at
            at = change.at
        return None

    def name_at(self, t: float) -> str:
        """The ledger's window at `t` (`-` outside every window); cached per stretch."""
        start, until, name = self._stretch
        if start <= t < until:
            return name or NO_WINDOW
        name = self.at(t)
        change = self.next_change(t) if self.names else None
        self._stretch = (t, math.inf if change is None else change.at, name)
        return name or NO_WINDOW

    def ahead(self, t: float, horizon: float) -> tuple[str, ...]:
        """The ledger's windows (`-` for none) in force at some instant of [t, t + horizon],
        the one now first; from the current stretch, so one comparison while no change is
        that close."""
        first = self.name_at(t)
        until = self._stretch[1]
        if t + horizon < until:
            return (first,)
        found = [first]
        at = t
        for _ in range(4 * len(self.names) + 8):
            change = self.next_change(at)
            if change is None or change.at > t + horizon:
                break
            name = change.window or NO_WINDOW
            if name not in found:
                found.append(name)
            at = change.at
        return tuple(found)

    def _candidates(self, t: float) -> list[float]:
        """Instants after t at which `at` may change, in order (see the module docstring)."""
        if not self.names:
            return []
        first = datetime.fromtimestamp(t, self.zone).date() - timedelta(days=1)
        found: set[float] = set()
        for n in range(_HORIZON_DAYS + 1):
            day = first + timedelta(days=n)
            for minute in self._clocks:
                wall = datetime.combine(day, time(minute // 60, minute % 60), self.zone)
                found.update(wall.replace(fold=f).timestamp() for f in (0, 1))
            found.update(self._offset_changes(day))
        return sorted(c for c in found if c > t)

    def _offset_changes(self, day: date) -> list[float]:
        """The instants in local `day` (and the next few hours) at which the UTC offset
        changes, to the second (bisection: zoneinfo does not list its transitions)."""
        lo = datetime.combine(day, time(0), self.zone).timestamp()
        hi = lo + 86400 + 7200
        if self._offset(lo) == self._offset(hi):
            return []
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._offset(mid) == self._offset(lo):
                lo = mid
            else:
                hi = mid
        return [hi]

    def _offset(self, t: float) -> timedelta | None:
        return datetime.fromtimestamp(t, self.zone).utcoffset()

    def describe(self, t: float) -> str:
        """ISO 8601 with the zone's offset."""
        return datetime.fromtimestamp(t, self.zone).isoformat()
