"""Plain, short-lived database connections for Spark code (planner, executors, driver).

Spark pickles readers and ships them to other processes, so nothing here is kept on an
object: each call opens a connection, uses it and closes it. Reads do not go through
:class:`roomstream.storage.Database` on SQLite because its interactions take the write
lock (``BEGIN IMMEDIATE``); a stream reader must never block the online writers.

Invariant: SQL is written with ``?`` placeholders, as everywhere in roomstream.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote, urlsplit

import psycopg

from roomstream.storage import DatabaseConfig

_IDENT = re.compile(r"^[a-z_][a-z0-9_]*$")


def config_from_options(options: Mapping[str, str]) -> DatabaseConfig:
    """The database named by Spark options: ``engine`` + ``path`` or ``dsn`` [+ ``schema``]."""
    engine = options.get("engine", "sqlite")
    if engine == "sqlite":
        path = options.get("path")
        if not path:
            raise ValueError("option 'path' (the SQLite file) is required for engine=sqlite")
        return DatabaseConfig(engine="sqlite", path=path)
    if engine == "postgres":
        dsn = options.get("dsn")
        if not dsn:
            raise ValueError("option 'dsn' is required for engine=postgres")
        return DatabaseConfig(engine="postgres", dsn=dsn, schema=options.get("schema") or None)
    raise ValueError(f"unknown engine {engine!r} (expected sqlite or postgres)")


def options_from_config(config: DatabaseConfig) -> dict[str, str]:
    """The inverse of :func:`config_from_options`: Spark options naming ``config``'s database."""
    if config.engine == "sqlite":
        return {"engine": "sqlite", "path": config.path}
    options = {"engine": "postgres", "dsn": config.dsn}
    if config.schema:
        options["schema"] = config.schema
    return options


class ReadConnection:
    """One autocommit connection; ``query`` takes ``?`` placeholders on both engines."""

    def __init__(self, engine: str, conn: Any) -> None:
        self.engine = engine
        self._conn = conn

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        if self.engine == "postgres":
            sql = sql.replace("%", "%%").replace("?", "%s")
            with self._conn.cursor() as cur:
                cur.execute(sql, params)
                return list(cur.fetchall())
        cur = self._conn.execute(sql, params)
        try:
            return list(cur.fetchall())
        finally:
            cur.close()

    def sequence_value(self, sequence: str) -> int:
        """The sequence's last handed-out value, 0 if it does not exist yet."""
        if not _IDENT.match(sequence):
            raise ValueError(f"not a plain SQL identifier: {sequence!r}")
        if self.engine == "postgres":
            exists = self.query("SELECT to_regclass(?)", (sequence,))
            if not exists or exists[0][0] is None:
                return 0
            last_value, is_called = self.query(f"SELECT last_value, is_called FROM {sequence}")[0]
            return int(last_value) if is_called else int(last_value) - 1
        try:
            rows = self.query(
                "SELECT last_value FROM roomstream_sequences WHERE name = ?", (sequence,)
            )
        except sqlite3.OperationalError:  # no sequence table yet
            return 0
        return int(rows[0][0]) if rows else 0


@contextmanager
def read_connection(config: DatabaseConfig) -> Iterator[ReadConnection]:
    """A short-lived autocommit connection for reading (each statement sees fresh data)."""
    if config.engine == "sqlite":
        conn = sqlite3.connect(config.path, isolation_level=None, timeout=30)
        try:
            conn.execute("PRAGMA busy_timeout=30000")
            yield ReadConnection("sqlite", conn)
        finally:
            conn.close()
        return
    kwargs: dict[str, Any] = {"autocommit": True, "connect_timeout": 10}
    if config.schema:
        if not _IDENT.match(config.schema):
            raise ValueError(f"not a plain SQL identifier: {config.schema!r}")
        kwargs["options"] = f"-c search_path={config.schema}"
    with psycopg.connect(config.dsn, **kwargs) as pg:
        yield ReadConnection("postgres", pg)


def jdbc_url(config: DatabaseConfig) -> str:
    """The PostgreSQL JDBC URL for ``config`` (user, password and schema carried over)."""
    if config.engine != "postgres":
        raise ValueError("JDBC is only used for PostgreSQL")
    parts = urlsplit(config.dsn)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or 5432
    dbname = parts.path.lstrip("/") or "postgres"
    params = []
    if parts.username:
        params.append(f"user={quote(parts.username)}")
    if parts.password:
        params.append(f"password={quote(parts.password)}")
    if config.schema:
        params.append(f"currentSchema={quote(config.schema)}")
    query = ("?" + "&".join(params)) if params else ""
    return f"jdbc:postgresql://{host}:{port}/{dbname}{query}"
