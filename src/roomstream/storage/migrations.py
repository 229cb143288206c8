"""Versioned schema migrations, applied in order when a database is opened.

A migration is ``schema/NNNN_name.sql`` (both engines), optionally with engine-specific
companions ``NNNN_name.sqlite.sql`` / ``NNNN_name.postgres.sql`` applied right after it.
Each version is applied in one transaction together with its bookkeeping row, so a failed
migration leaves the database at the previous version.

Any number of processes may migrate one database at once (every instance of a deployment
does so as it starts): each migration transaction first takes an exclusive lock (an
advisory lock on PostgreSQL, keyed by the schema; SQLite's transactions are exclusive
already), then re-reads the version, so each version is applied exactly once and the
others wait and find it done.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

from roomstream.storage.database import Database, Transaction

_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+?)(?:\.(sqlite|postgres))?\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    #: engine name (or "" for both) → SQL text
    scripts: dict[str, str]


def load_migrations() -> list[Migration]:
    found: dict[int, tuple[str, dict[str, str]]] = {}
    for entry in resources.files("roomstream.storage.schema").iterdir():
        match = _FILE.match(entry.name)
        if not match:
            continue
        version, name, engine = int(match[1]), match[2], match[3] or ""
        known = found.setdefault(version, (name, {}))
        if known[0] != name:
            raise RuntimeError(f"two migrations share version {version}: {known[0]}, {name}")
        known[1][engine] = entry.read_text(encoding="utf-8")
    # Versions may have gaps: numbers are handed out to branches ahead of their merge.
    versions = sorted(found)
    return [Migration(v, found[v][0], found[v][1]) for v in versions]


def split_statements(script: str) -> list[str]:
    """Split a script on semicolons that end a line; comments (``--``) are dropped."""
    statements, current = [], []
    for line in script.splitlines():
        stripped = line.split("--", 1)[0].rstrip()
        if not stripped:
            continue
        current.append(stripped)
        if stripped.endswith(";"):
            statements.append("\n".join(current)[:-1])
            current = []
    if current:
        statements.append("\n".join(current))
    return statements


#: The lock every migration transaction holds (see the module docstring).
MIGRATION_LOCK = "roomstream.migrations"


def _applied_versions(txn: Transaction) -> set[int]:
    # CREATE TABLE IF NOT EXISTS is not safe against a concurrent identical CREATE on
    # PostgreSQL (the catalogue's unique index fires), hence the lock here too.
    txn.lock_exclusively(MIGRATION_LOCK)
    txn.execute(
        "CREATE TABLE IF NOT EXISTS schema_version"
        " (version INTEGER NOT NULL PRIMARY KEY, name TEXT NOT NULL)"
    )
    return {int(r[0]) for r in txn.query("SELECT version FROM schema_version")}


def _apply(txn: Transaction, migration: Migration) -> None:
    # Re-check inside the transaction: another process may have applied it meanwhile.
    if migration.version in _applied_versions(txn):
        return
    for engine in ("", txn.engine_name):
        for statement in split_statements(migration.scripts.get(engine, "")):
            txn.execute(statement)
    txn.execute(
        "INSERT INTO schema_version (version, name) VALUES (?, ?)",
        (migration.version, migration.name),
    )


async def prepare_database(database: Database) -> int:
    """Bring the schema up to date; returns the version now in force."""
    migrations = load_migrations()
    applied = await database.run_interaction("applied_versions", _applied_versions)
    current = max(applied, default=0)
    newest = migrations[-1].version if migrations else 0
    if current > newest:
        raise RuntimeError(
            f"database schema version {current} is newer than this roomstream ({newest})"
        )
    # Every migration not yet applied, in order (one merged later with a lower number too).
    for migration in migrations:
        if migration.version not in applied:
            await database.run_interaction("prepare_database", _apply, migration)
    return max(current, newest)
