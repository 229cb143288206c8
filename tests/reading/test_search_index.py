"""The search index's batch-wise write (``SearchEngine.insert_txn``) on both engines:
one statement per batch, several batches for many rows, and still one row per event
when rows are written again (a rebuild over indexed events) or twice in one batch."""

from __future__ import annotations

from typing import Any, cast

from roomstream.reading.search import search_engine
from roomstream.storage import Database, Transaction


def rows(n: int, start: int = 1) -> list[tuple[str, str, str, str, int]]:
    return [
        (f"$e{i}", "!room:test", "content.body", f"word{i % 7} message number {i}", i)
        for i in range(start, start + n)
    ]


async def test_many_rows_and_rows_again_give_one_row_per_event(database: Database) -> None:
    statements: list[str] = []

    class Recording:
        """The transaction, recording each statement it runs (``executemany``: one a row)."""

        def __init__(self, txn: Transaction) -> None:
            self.txn = txn

        def __getattr__(self, name: str) -> Any:
            return getattr(self.txn, name)

        def execute(self, sql: str, params: Any = ()) -> Any:
            statements.append(sql)
            return self.txn.execute(sql, params)

        def executemany(self, sql: str, params: Any) -> Any:
            statements.extend(sql for _ in params)
            return self.txn.executemany(sql, params)

        def query(self, sql: str, params: Any = ()) -> Any:
            statements.append(sql)
            return self.txn.query(sql, params)

    def write_txn(txn: Transaction, batch: list[tuple[str, str, str, str, int]]) -> None:
        search_engine(database.engine_name).insert_txn(cast(Transaction, Recording(txn)), batch)

    await database.run_interaction("test_write", write_txn, rows(1201))
    # 1,201 rows: three statements (500 each), and no lookup before them.
    assert len(statements) == 3 and all("INSERT" in s for s in statements)
    # Written again (overlapping, and one event twice in a batch): nothing doubles.
    again = rows(300, start=1000)
    await database.run_interaction("test_write", write_txn, [*again, again[0]])

    def count_txn(txn: Transaction) -> tuple[int, int]:
        total = txn.query_one("SELECT COUNT(*) FROM event_search")
        distinct = txn.query_one("SELECT COUNT(DISTINCT event_id) FROM event_search")
        return int(total[0]), int(distinct[0])

    assert await database.run_interaction("test_count", count_txn) == (1299, 1299)
