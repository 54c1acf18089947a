"""Every table of the durable store, in one place (the migrations create the same).

    usage_minute   the ledger: one row per (minute, key, model, domain, status, team,
                   session, window), counters (session: the agent session, window: the
                   billing window it was priced in; "-" for none)
    usage_hour     the same, rolled up once minutes pass `ledger.minute_retention_days`
    budget_spend   spend per (scope, owner, period id): cost and tokens, added in the same
                   transaction as the ledger rows they come from (budgets read it)
    budget_overrides  temporary budget limits set through the admin API, until a time
    ledger_writers one row per ledger writer (process): the last flush it committed, so a
                   flush whose commit acknowledgement was lost is not added twice
    files          Batch API files (metadata); content in file_chunks, 1 MiB per row
    batches        one row per batch: its OpenAI body (JSON), status, lease
    items          one row per input line: pending -> done | failed, with the answer
    key_overrides  live per-key limits set through the admin API
    response_owners  one row per stored response (Responses API): the key that created it
                   and the domain holding it, written when the answer names it; the only
                   authority on who may read, chain, cancel or delete it (until `expires_at`)
    audit_log      every change to money and limits (admin API, reload, key expiry): who,
                   when, what, the value before and after; `once` dedupes across replicas
    alert_deliveries  one row per spend alert and webhook: its id is the dedupe key (once
                   per budget, threshold and period across replicas), the signed body, and
                   the delivery's state, attempts, lease and last outcome

Times are UTC epoch seconds (`bucket`, `lease_until`, `updated_at`): the same arithmetic in
both dialects, so a report can bucket by hour or day with `bucket - bucket % 3600`.
Usage dimensions are a unique index, not the primary key, so a later dimension (a team) or
counter (a cost) is a plain `add_column` plus, for a dimension, a new unique index.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Double,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
)

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "pk": "pk_%(table_name)s",
    }
)

# BIGINT autoincrement is INTEGER PRIMARY KEY (the rowid) only under that exact name in SQLite.
Id = BigInteger().with_variant(Integer(), "sqlite")

# The ledger's shape. The flush, the roll-up and the reports read these tuples, so a new
# counter needs a migration and one name here. `team` is the key's team when the request
# was made ("-": none); `window` the billing window it was priced in ("-": none);
# `cost_nanos` is in nano-units of `billing.currency`, and counts
# only priced requests: `unpriced_requests` says how many had no price (cost unknown).
DIMENSIONS = ("key", "model", "domain", "status", "team", "session", "window")
COUNTERS = (
    "requests",
    "errors",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "failed_prompt_tokens",
    "failed_completion_tokens",
    "cache_write_tokens",
    "estimated_requests",
    "unpriced_requests",
    "cost_nanos",
)


def _usage(name: str) -> Table:
    return Table(
        name,
        metadata,
        Column("id", Id, primary_key=True, autoincrement=True),
        Column("bucket", BigInteger, nullable=False),
        Column("key", String(128), nullable=False),
        Column("model", String(256), nullable=False),
        Column("domain", String(128), nullable=False),
        Column("status", Integer, nullable=False),
        Column("team", String(128), nullable=False, server_default="-"),
        Column("session", String(64), nullable=False, server_default="-"),
        Column("window", String(32), nullable=False, server_default="-"),
        *(Column(c, BigInteger, nullable=False, server_default="0") for c in COUNTERS),
        Index(f"uq_{name}_dims", "bucket", *DIMENSIONS, unique=True),
    )


usage_minute = _usage("usage_minute")
usage_hour = _usage("usage_hour")

ledger_writers = Table(
    "ledger_writers",
    metadata,
    Column("writer", String(64), primary_key=True),
    Column("seq", BigInteger, nullable=False),
    Column("updated_at", Double, nullable=False),
)

files = Table(
    "files",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("owner", String(128), nullable=False),
    Column("purpose", String(32), nullable=False),
    Column("filename", String(512), nullable=False),
    Column("bytes", BigInteger, nullable=False),
    Column("created_at", BigInteger, nullable=False),
)

file_chunks = Table(
    "file_chunks",
    metadata,
    Column("file_id", String(64), primary_key=True),
    Column("seq", Integer, primary_key=True),
    Column("data", LargeBinary, nullable=False),
)

batches = Table(
    "batches",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("owner", String(128), nullable=False),
    Column("body", Text, nullable=False),
    Column("status", String(32), nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("lease_owner", String(128), nullable=True),
    Column("lease_until", Double, nullable=False, server_default="0"),
    Index("ix_batches_owner_created", "owner", "created_at", "id"),
    Index("ix_batches_status", "status"),
)

items = Table(
    "items",
    metadata,
    Column("batch_id", String(64), primary_key=True),
    Column("idx", Integer, primary_key=True),
    Column("custom_id", Text, nullable=False),
    Column("request", Text, nullable=False),
    Column("state", String(16), nullable=False),
    Column("result", Text, nullable=True),
    Index("ix_items_batch_state", "batch_id", "state"),
)

key_overrides = Table(
    "key_overrides",
    metadata,
    Column("alias", String(128), primary_key=True),
    Column("requests_per_minute", BigInteger, nullable=False),
    Column("tokens_per_minute", BigInteger, nullable=False),
    Column("updated_at", Double, nullable=False),
)

budget_spend = Table(
    "budget_spend",
    metadata,
    Column("scope", String(8), primary_key=True),
    Column("owner", String(128), primary_key=True),
    Column("period", String(32), primary_key=True),
    Column("cost_nanos", BigInteger, nullable=False, server_default="0"),
    Column("tokens", BigInteger, nullable=False, server_default="0"),
    Column("updated_at", Double, nullable=False),
)

budget_overrides = Table(
    "budget_overrides",
    metadata,
    Column("scope", String(8), primary_key=True),
    Column("owner", String(128), primary_key=True),
    Column("period", String(8), primary_key=True),
    Column("metric", String(8), primary_key=True),
    Column("limit_value", BigInteger, nullable=False),
    Column("until", Double, nullable=False),
    Column("updated_at", Double, nullable=False),
)

response_owners = Table(
    "response_owners",
    metadata,
    Column("id", String(256), primary_key=True),
    Column("owner", String(128), nullable=False),
    Column("domain", String(128), nullable=False),
    Column("created_at", Double, nullable=False),
    Column("expires_at", Double, nullable=False),
    Index("ix_response_owners_expires_at", "expires_at"),
)

audit_log = Table(
    "audit_log",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("at", Double, nullable=False),
    Column("actor", String(128), nullable=False),
    Column("replica", String(64), nullable=False),
    Column("action", String(64), nullable=False),
    Column("target", String(256), nullable=False),
    Column("old_value", Text, nullable=True),
    Column("new_value", Text, nullable=True),
    Column("once", String(256), nullable=True),
    Index("ix_audit_log_at", "at"),
    Index("uq_audit_log_once", "once", unique=True),
)

alert_deliveries = Table(
    "alert_deliveries",
    metadata,
    Column("id", String(255), primary_key=True),
    Column("event", String(32), nullable=False),
    Column("webhook", Integer, nullable=False),
    Column("body", Text, nullable=False),
    Column("created_at", Double, nullable=False),
    Column("state", String(16), nullable=False),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("next_at", Double, nullable=False),
    Column("lease_owner", String(64), nullable=True),
    Column("lease_until", Double, nullable=False, server_default="0"),
    Column("last_status", Integer, nullable=True),
    Column("last_error", Text, nullable=True),
    Column("delivered_at", Double, nullable=True),
    Index("ix_alert_deliveries_state_next", "state", "next_at"),
)
