"""Spend alerts: webhooks told when a budget passes a threshold, when it resets, and when
a model without a price is served.

    every alerts.check_interval_sec
      detect    each budget's share spent (`SpendGate.states`: this process's view of
                every replica's spend) against `alerts.thresholds`; a budget entering a
                new period after it raised an alert in the last one (a reset); models
                served without a price since the last check
      enqueue   one delivery per event and webhook, its id the dedupe key
                (`threshold:key:alice:day_cost:day:2026-12-05:80#0`): the database keeps
                the first, so each goes out once per budget, threshold and period across
                every replica and restart (`app.db.alertbook`)
      deliver   claim what is due (a lease), POST it signed, record the outcome; a failed
                try is retried after `backoff_delay` (the upstream retry policy, kept in
                the database) up to `alerts.max_attempts`; a replica that dies mid-delivery
                leaves a lease that lapses, and another replica sends it (at least once:
                receivers dedupe on `x-tokengate-delivery`)

A body is signed with HMAC-SHA256 over its exact bytes, with the secret from
`alerts.secret_env`: `x-tokengate-signature: sha256=<hex>`. A Slack-format webhook gets
`{"text": ...}`, signed the same way.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

import httpx

from app.billing.periods import Calendar
from app.billing.prices import amount
from app.billing.spend import BudgetState, SpendGate
from app.config.alerting import AlertsConfig
from app.db.alertbook import DELIVERED, AlertBook
from app.db.engine import DatabaseUnavailable
from app.kinds import BudgetPeriod
from app.runtime import Runtime
from app.upstream.retry import backoff_delay

log = logging.getLogger("tokengate.alerts")
Event = tuple[str, str, dict[str, Any]]  # (dedupe key, event name, payload)


def sign(secret: bytes, body: bytes) -> str:
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def threshold_events(
    state: BudgetState,
    thresholds: Iterable[int],
    currency: str,
    calendar: Calendar,
    refused: bool = False,
) -> list[Event]:
    """The thresholds this budget has reached in its current period. One that refused a
    request counts as 100 % spent: admission reserves before it spends, so spend stops
    short of the limit by about a request, and 100 % would otherwise never be seen."""
    b = state.budget
    reached = [t for t in thresholds if state.spent * 100 >= t * b.limit or (refused and t <= 100)]
    out = []
    for t in reached:
        key = f"threshold:{b.scope}:{b.owner}:{b.name}:{state.window.id}:{t}"
        payload = _budget_payload(state, currency, calendar) | {"threshold_percent": t}
        payload["text"] = (
            f"{b.scope} {b.owner!r} has spent {round(100 * state.ratio, 1)} % of its "
            f"{b.period} {b.metric} budget ({_show(b.metric, state.spent, currency)} of "
            f"{_show(b.metric, b.limit, currency)}); it resets at {payload['resets_at']}."
        )
        out.append((key, "budget_threshold", payload))
    return out


def reset_event(state: BudgetState, currency: str, calendar: Calendar) -> Event:
    b = state.budget
    payload = _budget_payload(state, currency, calendar)
    payload["text"] = (
        f"the {b.period} {b.metric} budget of {b.scope} {b.owner!r} has reset: "
        f"{_show(b.metric, b.limit, currency)} available until {payload['resets_at']}."
    )
    return (f"reset:{b.scope}:{b.owner}:{b.name}:{state.window.id}", "budget_reset", payload)


def unpriced_event(model: str, day: str) -> Event:
    text = (
        f"model {model!r} was served without a price in billing.prices: its cost is "
        "recorded as unknown (add its price)."
    )
    return (f"unpriced:{model}:{day}", "unpriced_model", {"model": model, "text": text})


def _budget_payload(state: BudgetState, currency: str, calendar: Calendar) -> dict[str, Any]:
    b = state.budget
    money = b.metric == "cost"
    return {
        "scope": b.scope,
        "name": b.owner,
        "budget": b.name,
        "period": b.period,
        "metric": b.metric,
        "period_id": state.window.id,
        "limit": amount(b.limit) if money else b.limit,
        "spent": amount(state.spent) if money else state.spent,
        "used_ratio": round(state.ratio, 6),
        "currency": currency if money else None,
        "resets_at": calendar.describe(state.window.end),
    }


def _show(metric: str, value: int, currency: str) -> str:
    return f"{amount(value):g} {currency}" if metric == "cost" else f"{value:,} tokens"


def render(ident: str, event: str, payload: dict[str, Any], fmt: str, cluster: str) -> str:
    if fmt == "slack":
        return json.dumps({"text": f"[tokengate {cluster}] {payload['text']}"})
    sent = datetime.now(UTC).isoformat()
    return json.dumps({"id": ident, "event": event, "gateway": cluster, "at": sent, **payload})


class AlertCenter:
    def __init__(
        self,
        book: AlertBook,
        spend: SpendGate,
        replica: str,
        unpriced: Callable[[], set[str]],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.book = book
        self.spend = spend
        self.replica = replica
        self.unpriced = unpriced  # models served without a price since the last call
        self.clock = clock
        self._queued: set[str] = set()  # event keys this process has enqueued
        self._periods: dict[tuple[str, str, str], str] = {}  # budget -> period id seen
        self._client: httpx.AsyncClient | None = None
        self.cfg = AlertsConfig()
        self.secret = b""
        self.cluster = "tokengate"
        self.currency = "USD"

    def configure(self, runtime: Runtime) -> None:
        s = runtime.settings
        self.cfg, self.cluster, self.currency = s.alerts, s.cluster.name, s.billing.currency
        secret = runtime.alerts_secret
        self.secret = b"" if secret is None else secret.get_secret_value().encode()

    @property
    def enabled(self) -> bool:
        return bool(self.cfg.webhooks and self.secret)

    async def run(self) -> None:
        """The gateway's loop: check and deliver every `check_interval_sec`."""
        while True:
            await asyncio.sleep(self.cfg.check_interval_sec)
            try:
                await self.tick()
            except DatabaseUnavailable:
                continue  # the alerts wait in memory (`_queued` is not marked) and go later
            except Exception as exc:
                log.error("spend alerts check failed (tried again shortly): %r", exc)

    async def tick(self) -> None:
        if not self.enabled:
            return
        now = self.clock()
        await self.enqueue(await self.detect(now), now)
        await self.deliver(now)

    # -- detect ------------------------------------------------------------------------
    async def detect(self, now: float) -> list[Event]:
        calendar = self.spend.calendar
        events: list[Event] = []
        refused, self.spend.refused = self.spend.refused, set()
        for state in self.spend.states(now):
            b = state.budget
            full = (b.scope, b.owner, b.name) in refused
            events += threshold_events(state, self.cfg.thresholds, self.currency, calendar, full)
            if await self._reset(state, calendar):
                events.append(reset_event(state, self.currency, calendar))
        day = calendar.window(BudgetPeriod.DAY, now).id
        events += [unpriced_event(model, day) for model in sorted(self.unpriced())]
        return [e for e in events if e[0] not in self._queued]

    async def _reset(self, state: BudgetState, calendar: Calendar) -> bool:
        """A budget seen in a new period (or for the first time here) whose last period
        raised an alert has reset."""
        b = state.budget
        slot = (b.scope, b.owner, b.name)
        if self._periods.get(slot) == state.window.id or state.window.start is None:
            return False
        self._periods[slot] = state.window.id
        period: BudgetPeriod = b.period
        last = calendar.window(period, state.window.start - 1).id
        return await self.book.any_with_prefix(f"threshold:{b.scope}:{b.owner}:{b.name}:{last}:")

    async def enqueue(self, events: list[Event], now: float) -> None:
        rows: list[tuple[str, str, int, str]] = []
        for key, event, payload in events:
            for i, hook in enumerate(self.cfg.webhooks):
                if event in hook.events:
                    ident = f"{key}#{i}"
                    rows.append(
                        (ident, event, i, render(ident, event, payload, hook.format, self.cluster))
                    )
        await self.book.enqueue(rows, now)
        self._queued.update(key for key, _, _ in events)

    # -- deliver -----------------------------------------------------------------------
    async def deliver(self, now: float) -> int:
        """Send what is due; the number delivered."""
        sent = 0
        for ident in await self.book.due(now):
            delivery = await self.book.claim(ident, self.replica, now, self.cfg.lease_sec)
            if delivery is None or delivery.webhook >= len(self.cfg.webhooks):
                continue  # another replica has it, or the webhook is gone from the settings
            status, error = await self._post(
                delivery.webhook, delivery.id, delivery.event, delivery.body
            )
            tries = delivery.attempts + 1
            retry = None
            if error is not None and tries < self.cfg.max_attempts:
                cfg = self.cfg
                wait = backoff_delay(tries, cfg.backoff_ms / 1000, cfg.max_backoff_ms / 1000)
                retry = self.clock() + wait
            state = await self.book.settle(
                delivery, now=self.clock(), status=status, error=error, next_at=retry
            )
            sent += state == DELIVERED
            if error is not None:
                log.warning(
                    "alert %s to webhook %d: try %d failed (%s), %s",
                    delivery.id,
                    delivery.webhook,
                    tries,
                    error,
                    state,
                )
        return sent

    async def _post(
        self, webhook: int, ident: str, event: str, body: str
    ) -> tuple[int | None, str | None]:
        data = body.encode()
        headers = {
            "content-type": "application/json",
            "user-agent": "tokengate-alerts",
            "x-tokengate-event": event,
            "x-tokengate-delivery": ident,
            "x-tokengate-signature": sign(self.secret, data),
        }
        client = self._client
        if client is None:
            client = self._client = httpx.AsyncClient(timeout=self.cfg.timeout_ms / 1000)
        try:
            resp = await client.post(self.cfg.webhooks[webhook].url, content=data, headers=headers)
        except httpx.HTTPError as exc:
            return None, type(exc).__name__
        if 200 <= resp.status_code < 300:
            return resp.status_code, None
        return resp.status_code, f"HTTP {resp.status_code}"

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
