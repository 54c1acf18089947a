"""Cost, budgets and deferred (off-peak) work: the first link of `Metrics`' chain of families
(`traffic.py` says why a chain)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from app.metrics.base import Instruments


class CostFamilies(Instruments):
    def _add_spend(self, r: CollectorRegistry) -> None:
        self.cost = Counter(
            "tokengate_cost",
            "Spend in billing.currency units (from billing.prices; failed attempts' tokens "
            "included), by key and model. Exact figures are in the ledger (/admin/usage).",
            ["key", "model"],
            registry=r,
        )
        self.unpriced = Counter(
            "tokengate_unpriced_requests",
            "Requests that consumed tokens on a model without a price (cost unknown).",
            ["model"],
            registry=r,
        )
        self.budget_used = Gauge(
            "tokengate_budget_used_ratio",
            "Spend of a budget's current period over its limit (1 = spent), by scope "
            "(key|team), name, period (day|week|month|total) and metric (cost|tokens).",
            ["scope", "name", "period", "metric"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.budget_exceeded = Counter(
            "tokengate_budget_exceeded",
            "Requests refused because a budget had no room for them (429 budget_exceeded).",
            ["scope", "name", "budget"],
            registry=r,
        )
        self.deferred = Counter(
            "tokengate_deferred",
            "Deferred work by kind (batch: a Batch API job; response: a held background "
            "response) and outcome: held for an off-peak window, released in it (or on idle "
            "quota), early_released so as not to miss its deadline.",
            ["outcome", "kind"],
            registry=r,
        )

    def record_spend(self, key: str, model: str | None, nanos: int | None) -> None:
        m = self.model_label(model)
        if nanos is None:
            self._tally(self.unpriced, m).inc()
        elif nanos:
            self._tally(self.cost, key, m).inc(nanos / 1e9)

    def set_budget_used(
        self, scope: str, name: str, period: str, metric: str, ratio: float
    ) -> None:
        self._child(self.budget_used, scope, name, period, metric).set(ratio)

    def record_budget_exceeded(self, scope: str, name: str, budget: str) -> None:
        self._child(self.budget_exceeded, scope, name, budget).inc()

    def record_deferred(self, outcome: str, kind: str = "batch") -> None:
        """Deferred work (`kind`: batch | response) held for an off-peak window (`held`),
        or let go: `released` in the window, `early_released` before it (its deadline would
        be missed)."""
        self._child(self.deferred, outcome, kind).inc()
