"""The usage ledger: every settled request, in minute buckets, durable in the database.

Failures are recorded with what they consumed (docs/design.md, "What the second
article adds"), so a row keeps the tokens of failed attempts apart from billed usage.

    settle ─► add(entry)            a dict update on the hot path, nothing else
                 │                  (minute, key, model, domain, status, team, window) -> counters
                 ▼
    every flush_interval_sec ─► flush(): one transaction (app/db/usage.py), with the
                 │  budget spend of those rows per key, team and calendar period
                 │  ok      -> gone from memory
                 │  failed  -> kept as the *outstanding* flush, retried as it was, with the
                 │             same sequence number: if its commit had gone through, the
                 │             retry adds nothing; new entries gather meanwhile
                 ▼
    close (SIGTERM) ─► flush until nothing is left, or the database stays away:
                 │  then every unwritten row goes to a spill file (`ledger.spill_dir`)
                 ▼
    start ─► recover(): each spill file is written with the sequence numbers its process
             would have used (a file replayed twice adds nothing), then removed

While the database is unreachable the gateway keeps serving: entries gather in memory,
at most `ledger.max_buffered_rows` rows (entries for an existing row always fit), and are
written when it returns. `kill -9` loses at most one flush interval.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from app.billing.budget_rules import Amount, SpendKey
from app.billing.periods import Calendar
from app.config.schema import LedgerConfig
from app.db.engine import DatabaseUnavailable
from app.db.private import private_dir, write_private
from app.db.tables import COUNTERS, DIMENSIONS
from app.db.usage import BucketKey, UsageBook, UsageQuery

log = logging.getLogger("tokengate.ledger")


@dataclass(slots=True, init=False)
class UsageEntry:
    """One answered request's usage.

    (Built on every request: its `__init__` is written out, so the compiled build runs it
    as C; docs/development.md, "The compiled build", says why.)"""

    key: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    error: bool
    failed_prompt_tokens: int
    failed_completion_tokens: int
    domain: str
    cached_tokens: int
    status: int
    team: str
    cache_write_tokens: int
    estimated: bool  # no usage from the upstream: counted by the gateway
    cost_nanos: int | None  # None: the model has no price (cost unknown)
    session: str  # the agent session (sessions.py: bounded label), "-": none
    window: str  # the billing window it was priced in (`app.billing.timetable`)

    def __init__(
        self,
        key: str,
        model: str,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        error: bool = False,
        failed_prompt_tokens: int = 0,
        failed_completion_tokens: int = 0,
        domain: str = "-",
        cached_tokens: int = 0,
        status: int = 200,
        team: str = "-",
        cache_write_tokens: int = 0,
        estimated: bool = False,
        cost_nanos: int | None = 0,
        session: str = "-",
        window: str = "-",
    ) -> None:
        self.key = key
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.error = error
        self.failed_prompt_tokens = failed_prompt_tokens
        self.failed_completion_tokens = failed_completion_tokens
        self.domain = domain
        self.cached_tokens = cached_tokens
        self.status = status
        self.team = team
        self.cache_write_tokens = cache_write_tokens
        self.estimated = estimated
        self.cost_nanos = cost_nanos
        self.session = session
        self.window = window

    def counters(self) -> list[int]:
        """In the order of `app.db.tables.COUNTERS`."""
        return [
            1,
            1 if self.error else 0,
            self.prompt_tokens,
            self.completion_tokens,
            self.cached_tokens,
            self.failed_prompt_tokens,
            self.failed_completion_tokens,
            self.cache_write_tokens,
            1 if self.estimated else 0,
            1 if self.cost_nanos is None else 0,
            self.cost_nanos or 0,
        ]

    @property
    def tokens(self) -> int:
        """Every token consumed, failed attempts' included (what budgets count)."""
        return (
            self.prompt_tokens
            + self.completion_tokens
            + self.failed_prompt_tokens
            + self.failed_completion_tokens
        )


class LedgerMetrics(Protocol):
    def record_ledger_flush(self, seconds: float, rows: int, ok: bool) -> None: ...
    def set_ledger_backlog(self, rows: int) -> None: ...
    def record_ledger_dropped(self) -> None: ...


Buckets = dict[BucketKey, list[int]]
_PROMPT, _COMPLETION, _FAILED_P, _FAILED_C = (
    COUNTERS.index(c)
    for c in (
        "prompt_tokens",
        "completion_tokens",
        "failed_prompt_tokens",
        "failed_completion_tokens",
    )
)
_COST = COUNTERS.index("cost_nanos")
_TEAM = 1 + DIMENSIONS.index("team")  # in a bucket key, after the minute


class Ledger:
    def __init__(
        self,
        book: UsageBook,
        cfg: LedgerConfig,
        *,
        metrics: LedgerMetrics | None = None,
        clock: Callable[[], float] = time.time,
        calendar: Calendar | None = None,
    ) -> None:
        self.book = book
        self.cfg = cfg
        # The periods budget spend is written for (billing.timezone); set on reload too.
        self.calendar = calendar or Calendar()
        self.flush_interval = cfg.flush_interval_sec
        self.metrics = metrics
        self.clock = clock
        # One writer per process lifetime: its sequence numbers make flushes idempotent.
        self.writer = f"{socket.gethostname()[:40]}:{os.getpid()}:{os.urandom(4).hex()}"
        self._seq = 0
        self._pending: Buckets = {}
        self._outstanding: tuple[int, Buckets] | None = None
        self._lock = asyncio.Lock()
        self.dropped = 0
        self.last_flush: float | None = None

    # -- the hot path -------------------------------------------------------------------------
    def add(self, entry: UsageEntry) -> None:
        now = int(self.clock())
        key = (
            now - now % 60,
            entry.key,
            entry.model,
            entry.domain,
            entry.status,
            entry.team,
            entry.session,
            entry.window,
        )
        row = self._pending.get(key)
        if row is not None:
            row[0] += 1
            row[1] += 1 if entry.error else 0
            row[2] += entry.prompt_tokens
            row[3] += entry.completion_tokens
            row[4] += entry.cached_tokens
            row[5] += entry.failed_prompt_tokens
            row[6] += entry.failed_completion_tokens
            row[7] += entry.cache_write_tokens
            row[8] += 1 if entry.estimated else 0
            if entry.cost_nanos is None:
                row[9] += 1
            else:
                row[10] += entry.cost_nanos
        elif self.backlog < self.cfg.max_buffered_rows:
            self._pending[key] = entry.counters()
        else:
            self._drop(entry)

    def _drop(self, entry: UsageEntry) -> None:
        self.dropped += 1
        if self.metrics is not None:
            self.metrics.record_ledger_dropped()
        if self.dropped == 1 or self.dropped % 1000 == 0:
            log.error(
                "ledger buffer full (%d rows, ledger.max_buffered_rows) while the database "
                "is unreachable: %d entries dropped so far (key %s)",
                self.backlog,
                self.dropped,
                entry.key,
            )

    @property
    def backlog(self) -> int:
        """Rows not yet in the database."""
        held = len(self._outstanding[1]) if self._outstanding is not None else 0
        return len(self._pending) + held

    # -- flushing ------------------------------------------------------------------------------
    async def flush(self) -> None:
        """Write what is pending; raises `DatabaseUnavailable` (everything is kept)."""
        async with self._lock:
            if self._outstanding is None:
                if not self._pending:
                    return
                self._seq += 1
                self._outstanding, self._pending = (self._seq, self._pending), {}
            seq, rows = self._outstanding
            started = time.perf_counter()
            try:
                await self.book.write(self.writer, seq, rows, self._spend(rows))
            except BaseException:
                self._report(started, len(rows), ok=False)
                raise
            self._outstanding = None
            self.last_flush = self.clock()
            self._report(started, len(rows), ok=True)

    def _spend(self, *sources: Buckets) -> dict[SpendKey, Amount]:
        """Cost and tokens of the rows per key and team and each calendar period."""
        out: dict[SpendKey, list[int]] = {}
        ids_at = self.calendar.ids_at
        rows = (row for source in sources for row in source.items())
        for dims, v in rows:
            bucket, key, team = dims[0], dims[1], str(dims[_TEAM])
            cost, tokens = v[_COST], v[_PROMPT] + v[_COMPLETION] + v[_FAILED_P] + v[_FAILED_C]
            if not (cost or tokens):
                continue
            for period in ids_at(bucket):
                for owner in (("key", key), ("team", team)) if team != "-" else (("key", key),):
                    into = out.setdefault((*owner, period), [0, 0])
                    into[0] += cost
                    into[1] += tokens
        return {k: Amount(c, t) for k, (c, t) in out.items()}

    def unflushed_spend(self) -> dict[SpendKey, Amount]:
        """The spend of rows settled here and not yet in the database (call under `lock`)."""
        held = self._outstanding[1] if self._outstanding is not None else {}
        return self._spend(held, self._pending)

    @property
    def lock(self) -> asyncio.Lock:
        """Held by a flush: whoever reads the database and `unflushed_spend` under it sees
        every settled row exactly once."""
        return self._lock

    def _report(self, started: float, rows: int, *, ok: bool) -> None:
        if self.metrics is not None:
            self.metrics.record_ledger_flush(time.perf_counter() - started, rows, ok)
            self.metrics.set_ledger_backlog(self.backlog)

    async def flush_all(self, deadline: float) -> None:
        """Flush until nothing is left (entries that arrived during a retry included)."""
        while self.backlog:
            try:
                await self.flush()
            except DatabaseUnavailable:
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(0.5)

    async def close(self, grace_sec: float = 10.0) -> None:
        try:
            await self.flush_all(time.monotonic() + grace_sec)
        except DatabaseUnavailable as exc:
            where = self.spill()
            log.error(
                "shutting down with %d ledger rows unwritten (%s): %s; %s",
                self.backlog,
                exc,
                self.summary(),
                f"kept in {where}, written by the next start that reaches the database"
                if where is not None
                else f"and they could not be kept in {self.cfg.spill_dir} either",
            )
            raise

    # -- spill files: what a shutdown could not write ----------------------------------------
    def spill(self) -> Path | None:
        """Write every unwritten row to this process's spill file (atomically: a file is
        whole or absent). Each flush keeps the sequence number it has or would have had,
        so replaying the file is as idempotent as a retried flush. None: not written."""
        flushes = []
        if self._outstanding is not None:
            flushes.append(self._outstanding)
        if self._pending:
            flushes.append((self._seq + 1, self._pending))
        if not flushes:
            return None
        doc = {
            "version": 1,
            "writer": self.writer,
            "flushes": [
                {"seq": seq, "rows": [[list(k), v] for k, v in rows.items()]}
                for seq, rows in flushes
            ],
        }
        folder = Path(self.cfg.spill_dir)
        path = folder / f"ledger-spill-{self.writer.replace(':', '-').replace('/', '-')}.json"
        try:
            private_dir(folder)
            tmp = path.with_suffix(".tmp")
            write_private(tmp, json.dumps(doc))
            os.replace(tmp, path)
        except OSError as exc:
            log.error("ledger spill file %s could not be written: %r", path, exc)
            return None
        return path

    async def recover(self) -> int:
        """Write the spill files earlier processes left in `ledger.spill_dir` and remove
        them; returns the rows written. A file the database refuses now is kept for the
        next start. (Once, at start: the file reads are not worth a thread.)"""
        written = 0
        for path, writer, flushes in _read_spills(Path(self.cfg.spill_dir)):
            try:
                async with self._lock:
                    for seq, rows in flushes:
                        if await self.book.write(writer, seq, rows, self._spend(rows)):
                            written += len(rows)
            except DatabaseUnavailable:
                log.warning("ledger spill file %s kept: the database is unreachable", path)
                return written
            _remove(path)
            log.warning("ledger spill file %s written to the database and removed", path)
        return written

    def summary(self) -> dict[str, dict[str, int]]:
        """Unwritten totals per key, for the log line of a shutdown that could not flush."""
        out: dict[str, dict[str, int]] = {}
        held = self._outstanding[1] if self._outstanding is not None else {}
        for source in (held, self._pending):
            for key, values in source.items():
                into = out.setdefault(key[1], dict.fromkeys(COUNTERS, 0))
                for name, v in zip(COUNTERS, values, strict=True):
                    into[name] += v
        return out

    # -- reading and retention ------------------------------------------------------------------
    async def report(self, query: UsageQuery) -> list[dict[str, object]]:
        """Usage as the database has it once everything settled so far is flushed."""
        await self.flush_all(time.monotonic() + 2.0)
        return await self.book.report(query)

    async def maintain(self) -> int:
        """Roll old minutes into hours, drop hours past retention (housekeeping)."""
        cfg = self.cfg
        moved, _ = await self.book.maintain(
            int(self.clock()), cfg.minute_retention_days, cfg.hour_retention_days
        )
        return moved

    def describe(self) -> str:
        return self.book.db.where


def _bucket_key(raw: Sequence[Any]) -> BucketKey:
    """A spill file's row key as the book takes it (JSON has no tuples); a file written
    before the session and window dimensions has neither (`-`)."""
    bucket, key, model, domain, status, team, *rest = raw
    session = str(rest[0]) if rest else "-"
    window = str(rest[1]) if len(rest) > 1 else "-"
    return (int(bucket), str(key), str(model), str(domain), int(status), str(team), session, window)


Spill = tuple[Path, str, list[tuple[int, Buckets]]]


def _read_spills(folder: Path) -> list[Spill]:
    """The spill files in `folder`: (path, writer, [(seq, rows), ...]); an unreadable
    one is logged and left where it is."""
    out: list[Spill] = []
    for path in sorted(folder.glob("ledger-spill-*.json")) if folder.is_dir() else []:
        try:
            doc = json.loads(path.read_text())
            flushes = [
                (int(f["seq"]), {_bucket_key(k): [int(x) for x in v] for k, v in f["rows"]})
                for f in doc["flushes"]
            ]
            out.append((path, str(doc["writer"]), flushes))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.error("ledger spill file %s is unreadable, left in place: %r", path, exc)
    return out


def _remove(path: Path) -> None:
    path.unlink(missing_ok=True)
