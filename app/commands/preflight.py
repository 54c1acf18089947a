"""What `serve` needs before it can serve, asked the way `serve` asks it.

`tokengate check` runs these before it verifies the chain to the upstream, so a check
that passes means `serve` will start: the log output (`app.log.output_problem`, the
function `serve` calls), the listening address (`app.listen`, the socket `serve`
binds) and the state stores `serve` opens at start, each opened here with the very
classes `serve` uses: the database (reachable, and a schema `serve` accepts: at this
tokengate's head, or empty, which `serve` creates) and Redis when configured. A store
added later adds its check to `STATE_CHECKS`: one function from the settings to a
`Finding`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx

from app import listen
from app.commands.db import open_database
from app.config.schema import Settings
from app.db import migrate
from app.db.engine import DatabaseUnavailable
from app.db.unusable import DatabaseProblem
from app.log import output_problem
from app.runtime import Runtime
from app.state.link import connect, describe


@dataclass(frozen=True)
class Finding:
    what: str  # "log output /var/log/x.log", "listen 127.0.0.1:8080", ...
    problem: str | None = None  # None: fine
    fix: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None


def log_output(runtime: Runtime) -> Finding:
    output = runtime.settings.logging.output
    found = output_problem(output, runtime.source)
    if found is None:
        return Finding(f"log output {output}")
    return Finding(f"log output {output}", found.message, found.fix)


def listening(host: str, port: int) -> Finding:
    problem = listen.problem(host, port)
    if problem is None:
        return Finding(f"listen on {host}:{port}")
    with contextlib.suppress(httpx.HTTPError, ValueError):
        answer = httpx.get(f"http://{host}:{port}/health", timeout=1.0).json()
        if answer == {"status": "ok"}:
            problem += " (a tokengate answers /health there)"
    return Finding("listen", problem)  # the problem names the address


async def _database(settings: Settings) -> Finding:
    """The check `serve` makes before it binds (`app.commands.db.prepare_for_serve`),
    without creating anything: an empty database is fine, `serve` creates its schema."""
    try:
        db = open_database(settings)
    except DatabaseProblem as exc:
        return Finding(f"database {settings.database.path}", str(exc))
    what = f"database {db.where}"
    try:
        found = await migrate.state(db)
        if found.current is not None:
            migrate.check(found, db.where)
    except DatabaseUnavailable as exc:
        return Finding(
            what,
            str(exc),
            "check database.url / TOKENGATE_DATABASE_URL (or database.path) and that the "
            "database server is up and reachable from here",
        )
    except migrate.SchemaError as exc:
        return Finding(what, str(exc))
    finally:
        await db.close()
    return Finding(what + (" (empty: serve creates the schema)" if found.empty else ""))


async def _redis(settings: Settings) -> Finding | None:
    """Redis as `serve`'s store starts it (connect, refuse a cluster reached as a single
    server, load the scripts); named by its shape and addresses, never a password."""
    cfg = settings.redis
    if not cfg.enabled:
        return None
    link = connect(cfg)
    what = f"redis {link.target.where()}"
    try:
        await link.start(warm=1)
    except Exception as exc:
        return Finding(
            what,
            describe(exc),
            "start Redis or fix redis.url / TOKENGATE_REDIS_URL (or the Sentinel / Cluster "
            "settings); with redis.fail_mode = open serve starts anyway and limits are not "
            "shared until it answers",
        )
    finally:
        with contextlib.suppress(Exception):
            await link.close()
    return Finding(what)


# The stores `serve` opens at start, in that order.
STATE_CHECKS: tuple[Callable[[Settings], Awaitable[Finding | None]], ...] = (
    _database,
    _redis,
)


async def findings(runtime: Runtime, host: str, port: int) -> list[Finding]:
    out = [log_output(runtime), listening(host, port)]
    for check in STATE_CHECKS:
        found = await check(runtime.settings)
        if found is not None:
            out.append(found)
    return out
