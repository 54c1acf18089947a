"""`tokengate audit`: the audit trail of a running gateway, as a table or JSON.

Asks `GET /admin/audit` (the admin key from `--admin-key` or `TOKENGATE_ADMIN_KEY`)
for the changes since `--since` (`7d`, `24h`, `90m`, or a date or instant; `--until`
likewise), optionally only by one `--actor` (`admin`, `reload`, `expiry`), of one
`--action` (`key_limits.set`, or a prefix such as `key.`) or `--on` one target
(`key:alice`), newest first; `--target` is the gateway's URL, as for `tokengate usage`.
Exit 1 when the gateway cannot answer.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from app.commands.report import admin_key, answered, instant

_COLUMNS = ("at", "actor", "action", "target", "before", "after")
_WIDEST = 60  # a before/after wider than this is cut in the table (JSON shows it whole)


def run(args: Any) -> int:
    key = admin_key("audit", args)
    if key is None:
        return 2
    now = time.time()
    params: dict[str, str] = {"limit": str(args.limit)}
    for name, value in (("actor", args.actor), ("action", args.action), ("target", args.on)):
        if value:
            params[name] = value
    for name, value in (("since", instant(args.since, now)), ("until", instant(args.until, now))):
        if value is not None:
            params[name] = value
    base = args.target.rstrip("/")
    resp = answered(
        "audit",
        base,
        lambda: httpx.get(
            f"{base}/admin/audit",
            params=params,
            headers={"authorization": f"Bearer {key}"},
            timeout=60,
        ),
    )
    if resp is None:
        return 1
    body = resp.json()
    print(json.dumps(body, indent=2) if args.format == "json" else table(body["data"]))
    return 0


def table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no change recorded in that period"
    lines = [list(_COLUMNS)] + [[_cell(row.get(c)) for c in _COLUMNS] for row in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(_COLUMNS))]
    return "\n".join(
        "  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )


def _cell(value: object) -> str:
    if value is None:
        return "-"
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= _WIDEST else text[: _WIDEST - 3] + "..."
