"""Taking a database back to an earlier schema version (undoing migrations), to test what
a database persisted by an older release becomes when migrated: shared by the rebuild
tests of the visibility records and of the relations and search indexes."""

from __future__ import annotations

from roomstream.storage import Transaction
from roomstream.storage.migrations import load_migrations, split_statements


def downgrade_txn(txn: Transaction, below: int) -> None:
    """Undo every migration from ``below`` on: drop what their scripts create and
    forget their versions (they create tables, virtual tables, indexes and sequences, add
    and rename columns)."""
    for migration in reversed(load_migrations()):
        if migration.version < below:
            continue
        # This engine's scripts only (the other's may create what this one never had),
        # in the reverse of the order they were applied in.
        for engine in (txn.engine_name, ""):
            script = migration.scripts.get(engine, "")
            for statement in reversed(split_statements(script)):
                words = statement.split()
                if words[:2] == ["CREATE", "TABLE"]:
                    txn.execute(f"DROP TABLE {words[2]}")
                elif words[:3] == ["CREATE", "VIRTUAL", "TABLE"]:  # the FTS5 search index
                    txn.execute(f"DROP TABLE {words[3]}")
                elif words[:2] == ["ALTER", "TABLE"] and words[3:5] == ["ADD", "COLUMN"]:
                    txn.execute(f"ALTER TABLE {words[2]} DROP COLUMN {words[5]}")
                elif words[:2] == ["ALTER", "TABLE"] and words[3:5] == ["RENAME", "COLUMN"]:
                    old, new = words[5], words[7]
                    txn.execute(f"ALTER TABLE {words[2]} RENAME COLUMN {new} TO {old}")
                elif words[0] == "CREATE" and "INDEX" in words[:3]:
                    name = words[words.index("INDEX") + 1]
                    txn.execute(f"DROP INDEX IF EXISTS {name}")
                elif words[:2] == ["CREATE", "SEQUENCE"]:  # PostgreSQL's
                    txn.execute(f"DROP SEQUENCE {words[2].rstrip(';')}")
                elif words[:3] == ["INSERT", "INTO", "roomstream_sequences"]:  # SQLite's
                    name = statement.split("VALUES", 1)[1].split("'")[1]
                    txn.execute("DELETE FROM roomstream_sequences WHERE name = ?", (name,))
                else:
                    # Rows a migration lists or drops: nothing to undo.
                    assert words[0] in ("INSERT", "DELETE"), statement
        txn.execute("DELETE FROM schema_version WHERE version = ?", (migration.version,))
