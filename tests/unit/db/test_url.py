"""Naming the database: PostgreSQL URLs as operators write them, never a password shown."""

from __future__ import annotations

import pytest

from app.config.problems import ConfigError
from app.config.schema import DatabaseConfig
from app.db.engine import Database, DatabaseUnavailable
from app.db.url import database_url, postgres_url, url_secrets, where


@pytest.mark.parametrize(
    "raw",
    [
        "postgres://tg:s3cret-pw@db.internal:5433/tokengate",
        "postgresql://tg:s3cret-pw@db.internal:5433/tokengate",
        "postgresql+asyncpg://tg:s3cret-pw@db.internal:5433/tokengate",
    ],
)
def test_postgres_urls_go_through_asyncpg_and_show_no_password(raw: str) -> None:
    url = postgres_url(raw)
    assert url.drivername == "postgresql+asyncpg" and url.port == 5433
    assert where(url) == "postgresql://tg:***@db.internal:5433/tokengate"
    assert "s3cret" not in where(url)


def test_libpq_sslmode_becomes_asyncpg_ssl() -> None:
    url = postgres_url("postgresql://tg:pw@db/tokengate?sslmode=require")
    assert dict(url.query) == {"ssl": "require"}


def test_the_default_is_the_sqlite_file_under_var() -> None:
    url = database_url(DatabaseConfig())
    assert url.drivername == "sqlite+aiosqlite"
    assert str(url.database).endswith("var/tokengate.sqlite3")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("mysql://u:p@h/db", "scheme 'mysql' is not supported"),
        ("postgresql://u:p@h", "names no database"),
        ("not a url", "can not be parsed"),
        # an unencoded `@` or `:` in the password: SQLAlchemy's own error would quote it
        ("postgresql://gw:pA@pB:pC@db:5432/tg", "can not be parsed"),
        ("postgresql://gw:pA@pB@db:5432/tg", "can not be parsed"),
    ],
)
def test_a_bad_url_is_a_config_error_naming_the_setting(raw: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        postgres_url(raw)
    assert message in err.value.render() and "TOKENGATE_DATABASE_URL" in err.value.render()
    assert "pA" not in err.value.render() and "pB" not in err.value.render()


def test_the_redactor_is_given_the_url_and_its_password() -> None:
    raw = "postgresql://tg:s3cret-pw@db/tokengate"
    assert url_secrets(raw) == [raw, "s3cret-pw"]


async def test_an_unreachable_database_names_host_and_port_never_the_password() -> None:
    from tests.support.procs import free_port

    port = free_port()  # nothing listens there
    cfg = DatabaseConfig.model_validate(
        {"url": f"postgresql://tg:s3cret-pw@127.0.0.1:{port}/tokengate", "connect_timeout_sec": 2}
    )
    db = Database(cfg)
    with pytest.raises(DatabaseUnavailable) as err:
        await db.ping()
    message = str(err.value)
    assert f"127.0.0.1:{port}/tokengate" in message and "s3cret" not in message
    assert db.up is False and "s3cret" not in (db.last_error or "")
    await db.close()
