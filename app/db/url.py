"""Which database, and how to name it without its password.

`database.url` set: PostgreSQL through asyncpg (`postgres://`, `postgresql://` and
`postgresql+asyncpg://` accepted; libpq's `sslmode` becomes asyncpg's `ssl`). Unset: the
SQLite file at `database.path` through aiosqlite. `where()` is the only way a database is
named in a log line, an error or `/health/ready`: driver, user, host, port and database,
never the password.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.engine import URL, make_url

from app.config.problems import ConfigError, Problem
from app.config.schema import DatabaseConfig

_POSTGRES = {"postgres", "postgresql", "postgresql+asyncpg"}
_FIELD = "database.url"


def database_url(cfg: DatabaseConfig) -> URL:
    if cfg.url is None:
        path = Path(cfg.path).expanduser().resolve()
        return URL.create("sqlite+aiosqlite", database=str(path))
    return postgres_url(cfg.url.get_secret_value())


_UNPARSED = (
    "can not be parsed (the value is not shown: it may hold the password)",
    "write postgresql://USER:PASSWORD@HOST:5432/DBNAME with every `@`, `:`, `/`, `?`, `#` "
    "or `%` of the user and password percent-encoded (`@` is %40, `:` is %3A), or give the "
    "password apart as PGPASSWORD",
)


def postgres_url(raw: str) -> URL:
    # SQLAlchemy's own errors quote the URL (a ValueError for a bad port prints what it
    # took for the port: the tail of a password with an unencoded `@` or `:`), so none
    # of them is passed on, and a host holding `@` is the same mistake read differently.
    try:
        url = make_url(raw)
    except Exception:
        raise _bad(*_UNPARSED) from None
    if url.host is not None and any(c in url.host for c in "@/?#[] "):
        raise _bad(*_UNPARSED)
    if url.drivername not in _POSTGRES:
        raise _bad(
            f"scheme {url.drivername!r} is not supported",
            "use postgresql://USER:PASSWORD@HOST:5432/DBNAME, or unset it for the embedded "
            "SQLite file (database.path)",
        )
    if not url.database:
        raise _bad("the URL names no database", "end it with /DBNAME")
    query = dict(url.query)
    if "sslmode" in query:  # libpq's spelling; asyncpg takes the same values as `ssl`
        query.setdefault("ssl", query.pop("sslmode"))
    return url.set(drivername="postgresql+asyncpg", query=query)


def where(url: URL) -> str:
    """The database as shown to operators: no password, ever."""
    if url.get_backend_name() == "sqlite":
        return f"sqlite:{url.database}"
    from app.log import redacted_url  # the one redaction of every URL shown

    plain = url.set(drivername="postgresql", query={}).render_as_string(hide_password=False)
    return redacted_url(plain)


def url_secrets(raw: str) -> list[str]:
    """What the log redactor must hide: the URL as written and its password."""
    found = [raw]
    try:
        password = make_url(raw).password
    except Exception:  # unparsable: `serve` stops on it before anything is logged
        return found
    if password:
        found.append(str(password))
    return found


def _bad(message: str, fix: str) -> ConfigError:
    return ConfigError([Problem("database.url / TOKENGATE_DATABASE_URL", _FIELD, message, fix)])
