"""Every table has one writer module (``roomstream.storage.owners``): a scan of the
sources' string literals for writes (``INSERT INTO``, ``UPDATE ... SET``, ``DELETE
FROM``, ``TRUNCATE``, ``COPY ... FROM``, and ``insert_many("table", ...)`` calls)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from roomstream.storage.owners import BULK_WRITERS, DYNAMIC_WRITES, STORAGE_PLUMBING, TABLE_OWNERS

SRC = Path(__file__).resolve().parent.parent / "src"

#: A table name, or ``{}`` parts where an f-string names it through a variable.
_NAME = r"([\w.{}]+)"
WRITES = [
    re.compile(rf"\bINSERT\s+(?:OR\s+\w+\s+)?INTO\s+{_NAME}"),
    # Not ON CONFLICT ... DO UPDATE SET (an upsert: its INSERT names the table).
    re.compile(rf"(?<!DO )\bUPDATE\s+{_NAME}\s+SET\b"),
    re.compile(rf"\bDELETE\s+FROM\s+{_NAME}"),
    re.compile(rf"\bTRUNCATE\s+(?:TABLE\s+)?{_NAME}"),
    re.compile(rf"\bCOPY\s+{_NAME}(?:\s*\([^)]*\))?\s+FROM\b"),
]
DYNAMIC = "{}"


def _text(node: ast.expr) -> str | None:
    """A string literal's text; an f-string's with ``{}`` for each placeholder."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else DYNAMIC for v in node.values)
    return None


def _table(name: str) -> str:
    """``main.events`` (an attached SQLite database's) is ``events``; a name with a
    placeholder is dynamic."""
    return DYNAMIC if "{" in name else name.rsplit(".", 1)[-1]


def writes_in(source: str) -> Iterator[tuple[str, int]]:
    """(table, line) of every write in a module's source (``{}``: a table named by a
    variable). Docstrings are prose, not SQL."""
    tree = ast.parse(source)
    skip: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and body
            and isinstance(body[0], ast.Expr)
        ):
            skip.add(id(body[0].value))
        if isinstance(node, ast.JoinedStr):
            skip.update(id(v) for v in node.values)  # read as part of the f-string
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "insert_many" and node.args:
                name = _text(node.args[0])
                yield (DYNAMIC if name is None else _table(name)), node.lineno
            continue
        if not isinstance(node, ast.Constant | ast.JoinedStr) or id(node) in skip:
            continue
        text = _text(node)
        if text is None:
            continue
        for pattern in WRITES:
            for match in pattern.finditer(text):
                yield _table(match.group(1)), node.lineno


def violations(module: str, source: str) -> list[str]:
    """What is wrong with ``module``'s writes, one line each."""
    found = []
    for table, line in writes_in(source):
        where = f"{module}:{line}"
        if module in BULK_WRITERS or (table == DYNAMIC and module in STORAGE_PLUMBING):
            continue
        if table == DYNAMIC:
            if module not in DYNAMIC_WRITES:
                found.append(f"{where}: writes a table named by a variable (see DYNAMIC_WRITES)")
            continue
        owner = TABLE_OWNERS.get(table)
        if owner is None:
            found.append(f"{where}: writes {table}, which TABLE_OWNERS does not list")
        elif owner != module:
            found.append(f"{where}: writes {table}, owned by {owner}")
    return found


def _modules() -> Iterator[tuple[str, str]]:
    for path in sorted((SRC / "roomstream").rglob("*.py")):
        yield ".".join(path.relative_to(SRC).with_suffix("").parts), path.read_text()


def test_every_table_is_written_only_by_its_owner() -> None:
    found = [v for module, source in _modules() for v in violations(module, source)]
    assert found == []


def test_every_owner_writes_its_tables() -> None:
    """No stale entry: each listed owner does write its table (statically, or through
    the dynamic writes it declares)."""
    written = {(t, m) for m, source in _modules() for t, _ in writes_in(source)}
    stale = [
        (table, owner)
        for table, owner in TABLE_OWNERS.items()
        if (table, owner) not in written and table not in DYNAMIC_WRITES.get(owner, ())
    ]
    assert stale == []
    for module, tables in DYNAMIC_WRITES.items():
        assert {TABLE_OWNERS[t] for t in tables} == {module}
        assert (DYNAMIC, module) in written


@pytest.mark.parametrize(
    ("sql", "table"),
    [
        ('"INSERT INTO rooms (room_id) VALUES (?)"', "rooms"),
        ('"INSERT OR IGNORE INTO rooms (room_id) VALUES (?)"', "rooms"),
        ('"UPDATE rooms SET is_public = ? WHERE room_id = ?"', "rooms"),
        ('"DELETE FROM rooms WHERE room_id = ?"', "rooms"),
        ('"TRUNCATE TABLE rooms"', "rooms"),
        ('"TRUNCATE rooms"', "rooms"),
        ('"COPY rooms (room_id, creator) FROM STDIN"', "rooms"),
        ('f"INSERT INTO main.rooms ({cols}) SELECT 1"', "rooms"),
        ('"INSERT INTO"\n    " rooms (room_id) VALUES (?)"', "rooms"),
        ('txn.insert_many("rooms", ("room_id",), rows)', "rooms"),
        ('f"DELETE FROM {table} WHERE room_id = ?"', DYNAMIC),
        ("txn.insert_many(table, columns, rows)", DYNAMIC),
    ],
)
def test_the_scan_finds_each_kind_of_write(sql: str, table: str) -> None:
    source = f"x = ({sql})\n"
    assert [t for t, _ in writes_in(source)] == [table]
    assert violations("roomstream.client.elsewhere", source) != []


@pytest.mark.parametrize(
    "sql",
    [
        '"SELECT room_id FROM rooms"',
        '"INSERT INTO user_ips (user_id) VALUES (?) ON CONFLICT (user_id) DO UPDATE'
        ' SET last_seen = excluded.last_seen"',
        '"SELECT * FROM rooms FOR UPDATE"',
        '"COPY is faster than INSERTs"',
    ],
)
def test_reads_and_prose_are_not_writes(sql: str) -> None:
    assert [t for t, _ in writes_in(f"x = {sql}\n") if t != "user_ips"] == []


def test_docstrings_are_not_writes() -> None:
    source = (
        '"""We DELETE FROM rooms here, in prose."""\n\ndef f():\n    """UPDATE rooms SET x."""\n'
    )
    assert list(writes_in(source)) == []


def test_a_write_outside_the_owner_is_named() -> None:
    source = 'def f(t):\n    t.execute("UPDATE rooms SET is_public = ? WHERE room_id = ?")\n'
    assert violations("roomstream.client.store", source) == [
        "roomstream.client.store:2: writes rooms, owned by roomstream.rooms.persist"
    ]
    assert violations("roomstream.rooms.persist", source) == []
    unlisted = 'x = "INSERT INTO new_table (a) VALUES (?)"\n'
    assert violations("roomstream.rooms.persist", unlisted) == [
        "roomstream.rooms.persist:1: writes new_table, which TABLE_OWNERS does not list"
    ]
