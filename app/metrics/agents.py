"""Coding agents' metrics: prompt-cache affinity, per-key concurrency, and the Responses
API's WebSocket connections (Codex CLI's first choice)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from app.metrics.durable import DurableFamilies


class AgentFamilies(DurableFamilies):
    def _add_agent_metrics(self, r: CollectorRegistry) -> None:
        self.affinity = Counter(
            "tokengate_affinity",
            "Requests of a conversation placed by prompt-cache affinity, by the domain "
            "chosen and how: home (its domain), spill (its domain over the load bound), "
            "failover (its domain unavailable).",
            ["domain", "outcome"],
            registry=r,
        )
        self.prompt_cache = Counter(
            "tokengate_prompt_cache_tokens",
            "Prompt tokens the upstream reported as read from (kind=read) or written to "
            "(kind=write) its prompt cache, by domain; part of tokens_total{kind=prompt}.",
            ["domain", "kind"],
            registry=r,
        )
        self.key_waits = Counter(
            "tokengate_key_concurrency_waits",
            "Requests that waited for their key's max_concurrent, by outcome (granted | timeout).",
            ["key", "outcome"],
            registry=r,
        )
        self.sockets = Gauge(
            "tokengate_responses_websocket_connections",
            "Open Responses API WebSocket connections (Codex CLI's first choice).",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.socket_messages = Counter(
            "tokengate_responses_websocket_messages",
            "Client messages on Responses API WebSockets (kind = create|warmup|refused|"
            "ignored|waited; `waited`: a turn waited out its key's 429 before any output); "
            "each `create` is also one request in the request metrics.",
            ["kind"],
            registry=r,
        )
        self.socket_upgrades = Counter(
            "tokengate_responses_websocket_upgrades",
            "WebSocket upgrade requests on /v1/responses, by answer (101 accepted, 426 "
            "refused so the client falls back to HTTP, 401 bad key).",
            ["status"],
            registry=r,
        )

    def record_affinity(self, domain: str, outcome: str) -> None:
        self._child(self.affinity, domain, outcome).inc()

    def record_prompt_cache(self, domain: str, read: int, written: int) -> None:
        if read:
            self._child(self.prompt_cache, domain, "read").inc(read)
        if written:
            self._child(self.prompt_cache, domain, "write").inc(written)

    def record_key_wait(self, key: str, outcome: str) -> None:
        self._child(self.key_waits, key, outcome).inc()

    def record_socket_upgrade(self, status: int) -> None:
        self._child(self.socket_upgrades, str(status)).inc()

    def socket_opened(self) -> None:
        self.sockets.inc()

    def socket_closed(self) -> None:
        self.sockets.dec()

    def record_socket_message(self, kind: str) -> None:
        self._child(self.socket_messages, kind).inc()
