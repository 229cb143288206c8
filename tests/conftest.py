"""Shared fixtures: databases on both engines, and the real services this machine runs.

PostgreSQL: one database per test session (created and dropped here), one schema per test.
Under CI=true a test that needs PostgreSQL or Redis fails when the server is unreachable;
elsewhere it is skipped with the reason.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from psycopg import sql

from roomstream.storage import Database, DatabaseConfig, connect, prepare_database

PG_ADMIN_DSN = os.environ.get("ROOMSTREAM_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("ROOMSTREAM_TEST_REDIS", "redis://127.0.0.1:6379/0")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
ENGINES = ("sqlite", "postgres")

# Property tests are judged on what they find, never on how fast one example runs: no
# deadline and no too_slow health check (both fail on a busy machine). The rest comes from
# the profile Hypothesis picked (under CI: derandomized, no example database).
settings.register_profile(
    "roomstream",
    settings(settings.default, deadline=None, suppress_health_check=[HealthCheck.too_slow]),
)
settings.load_profile("roomstream")


def service_unavailable(what: str, exc: BaseException) -> None:
    message = f"{what} is unreachable: {exc}"
    if IN_CI:
        pytest.fail(message + " (CI=true: tests that need it fail rather than skip)")
    pytest.skip(message)


def pg_dsn(dbname: str) -> str:
    base, _, _ = PG_ADMIN_DSN.rpartition("/")
    return f"{base}/{dbname}"


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A PostgreSQL database for this test session; yields its DSN."""
    name = f"roomstream_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    try:
        admin = psycopg.connect(PG_ADMIN_DSN, autocommit=True, connect_timeout=5)
    except psycopg.Error as exc:
        service_unavailable("PostgreSQL at 127.0.0.1:5432", exc)
        raise  # unreachable: fail/skip raise
    with admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield pg_dsn(name)
    finally:
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def _new_pg_schema(dsn: str) -> str:
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    return schema


@pytest.fixture(params=ENGINES)
def engine_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def db_config(engine_name: str, tmp_path: Path, request: pytest.FixtureRequest) -> DatabaseConfig:
    """A fresh, empty database on the parametrised engine."""
    if engine_name == "sqlite":
        return DatabaseConfig(engine="sqlite", path=str(tmp_path / "test.db"))
    dsn = request.getfixturevalue("pg_database")
    return DatabaseConfig(engine="postgres", dsn=dsn, schema=_new_pg_schema(dsn), pool_min=1)


@pytest.fixture
async def database(db_config: DatabaseConfig) -> AsyncIterator[Database]:
    """A prepared (migrated) database on each engine."""
    db = connect(db_config)
    try:
        await prepare_database(db)
        yield db
    finally:
        await db.close()


@pytest.fixture
def redis_url() -> str:
    import redis

    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3)
    try:
        client.ping()
    except redis.RedisError as exc:
        service_unavailable("Redis at 127.0.0.1:6379", exc)
    finally:
        client.close()
    return REDIS_URL
