"""Where state lives: Redis for the hot shared state (limits, pacing), the database for
what must not be lost (the ledger, batches, live limits)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, model_validator

from app.config.redis_target import RedisTarget, TargetError, parse_target
from app.config.section import PositiveInt, Section


class RedisConfig(Section):
    url: SecretStr | None = Field(
        None,
        description="Redis shared by replicas (`TOKENGATE_REDIS_URL`): `redis://host:6379/0`, "
        "`rediss://` (TLS), `unix:///path/redis.sock`, "
        "`redis+sentinel://h1:26379,h2:26379/service`, `redis+cluster://h1:6379,h2:6379`; "
        "unset (and no `sentinels`) keeps limits in-process.",
    )
    password: SecretStr | None = Field(
        None,
        description="Password of the Redis servers (`TOKENGATE_REDIS__PASSWORD`); wins over one "
        "in `url`, so the URL can live in a config file and the secret elsewhere.",
    )
    sentinels: list[str] = Field(
        default_factory=list,
        description="Sentinel addresses (`host:port`, JSON list in the environment) watching "
        "`sentinel_service`; the gateway follows the master they name, through failovers. "
        "The alternative to a `redis+sentinel://` URL.",
    )
    sentinel_service: str | None = Field(
        None, description="Name of the master the Sentinels monitor (`sentinel monitor NAME`)."
    )
    sentinel_password: SecretStr | None = Field(
        None,
        description="Password of the Sentinels themselves (`requirepass` in sentinel.conf), "
        "when they have one; the master's is `password` or the URL's.",
    )
    cluster: bool = Field(
        False,
        description="`url` is a seed node of a Redis Cluster (same as `redis+cluster://`). Every "
        "script's keys share one hash slot, so no call is ever cross-slot.",
    )
    tls_ca_file: str | None = Field(
        None,
        description="CA bundle (PEM) that signed the Redis server's certificate (`rediss://`); "
        "unset: the system's CAs.",
    )
    tls_cert_file: str | None = Field(
        None, description="Client certificate (PEM) when Redis asks for one (`tls-auth-clients`)."
    )
    tls_key_file: str | None = Field(None, description="Private key (PEM) of `tls_cert_file`.")
    tls_verify_hostname: bool = Field(
        True,
        description="Check that the server certificate names the host connected to. Off only "
        "for servers reached by an address their certificate does not list.",
    )
    fail_mode: Literal["open", "closed"] = Field(
        "open",
        description="Redis unreachable: `open` keeps serving, each replica enforcing every "
        "limit and domain quota divided by the replicas seen alive in the last minute; "
        "`closed` answers 503 `redis_unavailable` (and readiness fails).",
    )
    assumed_replicas: PositiveInt = Field(
        1,
        description="While Redis is unreachable each replica enforces limit / max(replicas seen "
        "alive in the last minute, this). Set it to the usual replica count so a replica that "
        "started during an outage (it has seen nobody) does not enforce a whole limit alone.",
    )
    key_prefix: str = Field(
        "tokengate:",
        pattern=r"^[^{}]*$",
        description="Prefix of every Redis key (no braces: they would change the hash slot).",
    )
    timeout_ms: PositiveInt = Field(
        250,
        description="Timeout of one Redis round trip. Redis answers in well under 1 ms; the "
        "rest is this process being late to read under load. Three timeouts in a row (or a "
        "refused connection) count as Redis being unreachable.",
    )
    connect_timeout_ms: PositiveInt = Field(
        1000,
        description="Timeout of opening one connection (TCP, TLS handshake, AUTH); apart from "
        "`timeout_ms` because a TLS handshake under a burst takes longer than a command.",
    )
    max_connections: PositiveInt = Field(
        64,
        description="Redis connections per process (per node with Cluster). Calls are batched, "
        "so a process rarely holds more than a few.",
    )

    @property
    def enabled(self) -> bool:
        return self.url is not None or bool(self.sentinels)

    @model_validator(mode="after")
    def _target(self) -> RedisConfig:
        target = self.target()  # a bad URL stops the start, with no secret in the message
        tls_files = (self.tls_ca_file, self.tls_cert_file, self.tls_key_file)
        if any(tls_files) and (target is None or not target.tls):
            raise ValueError("redis.tls_* apply to TLS connections: use a rediss:// URL")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("redis.tls_cert_file and redis.tls_key_file go together")
        return self

    def target(self) -> RedisTarget | None:
        """Where Redis is (None: not configured)."""
        try:
            return parse_target(
                None if self.url is None else self.url.get_secret_value(),
                sentinels=self.sentinels,
                sentinel_service=self.sentinel_service,
                cluster=self.cluster,
                password=None if self.password is None else self.password.get_secret_value(),
            )
        except TargetError as exc:
            raise ValueError(str(exc)) from None


class DatabaseConfig(Section):
    url: SecretStr | None = Field(
        None,
        description="PostgreSQL URL shared by every replica (`TOKENGATE_DATABASE_URL`; "
        "`postgresql://user:password@host:5432/tokengate`, `postgres://` and "
        "`?sslmode=require` accepted). Unset: the embedded SQLite file at `database.path`.",
    )
    path: str = Field(
        "var/tokengate.sqlite3",
        description="SQLite file of the durable state (usage ledger, batches, files, live "
        "key limits) when `database.url` is unset; its directory is created. One node only: "
        "replicas on several hosts need `database.url`.",
    )
    pool_size: PositiveInt = Field(5, description="PostgreSQL connections each process keeps open.")
    max_overflow: int = Field(
        5, ge=0, description="Extra PostgreSQL connections a burst may open beyond `pool_size`."
    )
    connect_timeout_sec: float = Field(
        5, gt=0, le=120, description="Timeout of opening one database connection."
    )
    statement_timeout_sec: float = Field(
        30,
        gt=0,
        description="Longest one database statement may run (PostgreSQL), or wait for the "
        "file lock (SQLite busy timeout).",
    )


class LedgerConfig(Section):
    path: str | None = Field(
        None,
        description="Deprecated and ignored: the ledger lives in the database "
        "(`database.path`, or `database.url`). Still accepted so older files load.",
    )
    flush_interval_sec: float = Field(
        1.0,
        gt=0,
        le=60,
        description="How often settled requests are written to the database (one transaction "
        "per flush). A `kill -9` loses at most this much; SIGTERM loses nothing.",
    )
    max_buffered_rows: PositiveInt = Field(
        500_000,
        description="Most unwritten ledger rows (one per minute, key, model, domain and "
        "status) kept in memory while the database is unreachable; past it new rows are "
        "dropped and counted in `tokengate_ledger_dropped_total`.",
    )
    minute_retention_days: PositiveInt = Field(
        14,
        description="Minute buckets older than this are rolled up into hour buckets.",
    )
    hour_retention_days: int = Field(
        0,
        ge=0,
        description="Hour buckets older than this are deleted; 0 keeps them forever.",
    )
    spill_dir: str = Field(
        "var",
        description="Where a shutdown that cannot reach the database writes the ledger rows "
        "still unwritten (one JSON file per process); the next start that reaches the database "
        "writes them and removes the file. Relative to the working directory.",
    )


class AuditConfig(Section):
    retention_days: int = Field(
        365,
        ge=0,
        description="Audit rows (every change to limits, budgets, keys, prices and windows "
        "through the admin API, a reload or a key's expiry) older than this are deleted; 0 "
        "keeps them forever.",
    )


class BatchConfig(Section):
    path: str | None = Field(
        None,
        description="Deprecated and ignored: files, batches and their items live in the "
        "database (`database.path`, or `database.url`). Still accepted so older files load.",
    )
    max_file_bytes: PositiveInt = Field(
        100 * 1024 * 1024, description="Largest `POST /v1/files` upload; larger gets 413."
    )
    max_items: PositiveInt = Field(50000, description="Most requests in one batch.")
    concurrency: PositiveInt = Field(
        16, description="Items of one batch in flight at once from one process."
    )
    share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="Fraction of a domain's `max_inflight` batch items may hold; interactive "
        "traffic always keeps the rest and is always dispatched first.",
    )
    lease_sec: float = Field(
        10,
        gt=0,
        description="A batch is owned by one process for this long, renewed while "
        "it runs; after a crash another replica (or the restart) takes it over. Measured "
        "on the database's clock, so replicas' clocks need not agree.",
    )
    defer_window: str | None = Field(
        "auto",
        description="The billing window (a name in `billing.windows`) batches wait for before "
        "their items are sent; `auto`: `offpeak` if `billing.windows` has it, else none; "
        "null or `none`: batches run at once (on the capacity interactive traffic leaves).",
    )
    item_estimate_sec: float = Field(
        2.0,
        gt=0,
        description="Expected seconds per item per concurrent slot, to judge whether a held "
        "batch would still finish inside its `completion_window` if it waited for the window: "
        "if not, it is released early (reported in the batch and the metrics).",
    )
    defer_margin_sec: float = Field(
        3600.0,
        ge=0,
        description="Safety margin kept before a held batch's `completion_window` ends.",
    )
