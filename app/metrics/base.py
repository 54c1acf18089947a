"""What every family of metrics shares: the registry, label hygiene, cached children.

Label values are bounded: `key` is the alias, `model` is one of the configured or
discovered models (else `other`), `domain` comes from the config. Label children are
cached per label tuple because `.labels()` takes a lock and builds a tuple each call;
the hot path's children are tally cells (`app.tally`) that prometheus_client reads when
the registry is collected, not per call.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client import multiprocess as _mp

from app.status.board import StatusBoard
from app.status.recent import RecentErrors
from app.status.ring import Ring
from app.tally import Fold, Tally

MAX_MODEL_LABELS = 200
LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
QUEUE = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


def multiprocess_enabled() -> bool:
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


def mark_process_dead(pid: int) -> None:
    """Drop a dead worker's live gauges (called by the supervisor, if any)."""
    if multiprocess_enabled():
        _mp.mark_process_dead(pid)  # type: ignore[no-untyped-call]


class UsageLike(Protocol):
    """What `record_answer` reads of a ledger entry (`app.billing.ledger.UsageEntry`)."""

    @property
    def key(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def completion_tokens(self) -> int: ...
    @property
    def failed_prompt_tokens(self) -> int: ...
    @property
    def failed_completion_tokens(self) -> int: ...


class RedisStateLike(Protocol):
    """What `record_redis_state` reads (`app.state.redis_engine.RedisState`)."""

    @property
    def up(self) -> bool: ...
    @property
    def degraded(self) -> bool: ...
    @property
    def misconfigured(self) -> bool: ...
    @property
    def replicas(self) -> int: ...


class Instruments:
    def __init__(self, registry: CollectorRegistry, models: Iterable[str] = ()) -> None:
        self.registry = registry
        self._models: set[str] = set(models)
        self._children: dict[tuple[Any, tuple[str, ...]], Any] = {}
        self._tallies: dict[tuple[Any, tuple[str, ...]], Tally] = {}
        self._write_through = multiprocess_enabled()
        self._ring: Ring | None = None
        self._errors: RecentErrors | None = None
        registry.register(Fold(self.fold))  # first: every instrument is collected after it

    def watch(self, board: StatusBoard | None) -> None:
        """Feed `board` (the status page's recent traffic) from the verbs too."""
        self._ring = board.ring if board is not None else None
        self._errors = board.errors if board is not None else None

    # -- label hygiene -------------------------------------------------------------
    def add_models(self, models: Iterable[str]) -> None:
        for model in models:
            if len(self._models) >= MAX_MODEL_LABELS:
                return
            self._models.add(model)

    def model_label(self, model: str | None) -> str:
        if not model:
            return "none"
        return model if model in self._models else "other"

    def _child(self, metric: Any, *labels: str) -> Any:
        # (metric, labels): the call's own tuple of labels, not a new flat one (a flat
        # tuple is a list extended and copied in the compiled build); a metric hashes by
        # identity
        key = (metric, labels)
        child = self._children.get(key)
        if child is None:
            child = metric.labels(*labels)
            self._children[key] = child
        return child

    def _tally(self, metric: Any, *labels: str) -> Tally:
        """The hot path's cell for one child (`app.tally`)."""
        key = (metric, labels)
        tally = self._tallies.get(key)
        if tally is None:
            tally = self._tallies[key] = Tally(self._child(metric, *labels), self._write_through)
        return tally

    def fold(self) -> None:
        """Hand every tally to prometheus_client (before any read of the registry)."""
        for tally in self._tallies.values():
            tally.fold()
