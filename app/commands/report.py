"""`tokengate usage`: the ledger of a running gateway, as a table, CSV or JSON.

Asks `GET /admin/usage` (the admin key from `--admin-key` or `TOKENGATE_ADMIN_KEY`) for
a period (`--since 7d`, `24h`, `90m` or a date or instant; `--until` likewise) grouped
`--by` key, team, model or domain, optionally per `--granularity` hour or day of the
gateway's `billing.timezone`, and prints tokens by kind, requests, errors, the share of
estimated usage and the cost, with a total line. Exit 1 when the gateway cannot answer.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from typing import Any

import httpx

_RELATIVE = re.compile(r"^(\d+)([mhdw])$")
_UNIT_SEC = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
# (header, field, kind): the table's columns after the group columns
_COLUMNS = (
    ("requests", "requests", "int"),
    ("errors", "errors", "int"),
    ("prompt", "prompt_tokens", "int"),
    ("cached", "cached_tokens", "int"),
    ("cache write", "cache_write_tokens", "int"),
    ("completion", "completion_tokens", "int"),
    ("failed", "failed", "int"),
    ("estimated", "estimated_share", "share"),
    ("cost", "cost", "cost"),
)


def instant(value: str | None, now: float) -> str | None:
    """`7d` / `24h` / `90m` / `2w` before now (epoch seconds), else passed as it is (an
    ISO date or instant, read by the gateway in its billing time zone)."""
    if value is None:
        return None
    found = _RELATIVE.match(value.strip())
    if found:
        return str(int(now - int(found.group(1)) * _UNIT_SEC[found.group(2)]))
    return value.strip()


def fetch(
    target: str,
    admin_key: str,
    *,
    since: str | None,
    until: str | None,
    by: str,
    granularity: str | None,
    csv: bool,
) -> httpx.Response:
    now = time.time()
    params = {"group_by": by}
    for name, value in (("from", instant(since, now)), ("to", instant(until, now))):
        if value is not None:
            params[name] = value
    if granularity:
        params["granularity"] = granularity
    headers = {"authorization": f"Bearer {admin_key}"}
    if csv:
        headers["accept"] = "text/csv"
    base = target.rstrip("/")
    return httpx.get(f"{base}/admin/usage", params=params, headers=headers, timeout=60)


def table(body: dict[str, Any]) -> str:
    """Aligned columns, thousands separators, `unknown` for a cost without a price."""
    groups = (["period"] if body.get("granularity") else []) + list(body["group_by"])
    currency = body.get("currency", "")
    rows = [_cells(r, groups, currency) for r in body["data"]]
    total = _cells(body["totals"], groups, currency, total=True)
    head = [*groups, *(h for h, _, _ in _COLUMNS)]
    lines = [head, *rows, total] if rows else [head]
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    numeric = len(groups)
    out = []
    for n, line in enumerate(lines):
        cells = [
            cell.rjust(w) if i >= numeric else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(line, widths, strict=True))
        ]
        if rows and n == len(lines) - 1:
            out.append("  ".join("-" * w for w in widths))
        out.append("  ".join(cells).rstrip())
    if not rows:
        out.append("(no usage in this period)")
    return "\n".join(out)


def _cells(row: dict[str, Any], groups: list[str], currency: str, total: bool = False) -> list[str]:
    lead = ["total", *[""] * (len(groups) - 1)] if total else [str(row.get(g)) for g in groups]
    row = {**row, "failed": row["failed_prompt_tokens"] + row["failed_completion_tokens"]}
    cells = []
    for _, name, kind in _COLUMNS:
        value = row.get(name)
        if kind == "int":
            cells.append(f"{int(value or 0):,}")
        elif kind == "share":
            cells.append(f"{100 * float(value or 0):.1f}%")
        elif value is None:
            cells.append("unknown")
        else:
            more = f" (+{row['unpriced_requests']} unpriced)" if row["unpriced_requests"] else ""
            cells.append(f"{float(value):,.6f} {currency}{more}")
    return [*lead, *cells]


def admin_key(command: str, args: Any) -> str | None:
    """The admin key of an admin command (`--admin-key`, else `TOKENGATE_ADMIN_KEY`);
    None, said on stdout, when there is none (the command then exits 2)."""
    key: str = args.admin_key or os.environ.get("TOKENGATE_ADMIN_KEY", "")
    if not key:
        print(f"tokengate {command}: no admin key: pass --admin-key or set TOKENGATE_ADMIN_KEY")
        return None
    return key


def answered(command: str, target: str, ask: Callable[[], httpx.Response]) -> httpx.Response | None:
    """The gateway's 200 to an admin command's request; None, said on stdout, when it
    cannot be reached or answers anything else (the command then exits 1)."""
    try:
        resp = ask()
    except httpx.HTTPError as exc:
        print(f"tokengate {command}: cannot reach {target}: {exc}")
        return None
    if resp.status_code != 200:
        print(f"tokengate {command}: {resp.status_code} from {target}: {message(resp)}")
        return None
    return resp


def run(args: Any) -> int:
    key = admin_key("usage", args)
    if key is None:
        return 2
    resp = answered(
        "usage",
        args.target,
        lambda: fetch(
            args.target,
            key,
            since=args.since,
            until=args.until,
            by=args.by,
            granularity=args.granularity,
            csv=args.format == "csv",
        ),
    )
    if resp is None:
        return 1
    if args.format == "csv":
        print(resp.text, end="")
    elif args.format == "json":
        print(json.dumps(resp.json(), indent=2))
    else:
        print(table(resp.json()))
    return 0


def message(resp: httpx.Response) -> str:
    try:
        return str(resp.json()["error"]["message"])
    except Exception:
        return resp.text[:200]
