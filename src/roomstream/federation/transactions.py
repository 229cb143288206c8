"""The federation transactions this server answered (``federation_received_transactions``).

A sending server retries a transaction until it gets an answer; the spec requires that a
retry (same origin, same transaction ID) is not processed again. The answer given the
first time is kept for :data:`KEEP_MS` and given again (Synapse's ``received_transactions``,
kept for a day there too). Pruning is on write: each stored answer removes those past the
keeping time, a bounded amount at a time.
"""

from __future__ import annotations

from typing import Any

import orjson

from roomstream.storage import Database, Transaction

#: How long an answered transaction is remembered (milliseconds).
KEEP_MS = 24 * 3600 * 1000
#: Most expired rows removed by one store (keeps each write bounded).
PRUNE_BATCH = 500


class ReceivedTransactions:
    """Answers to ``/send`` transactions, by (origin, transaction ID)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def get(self, origin: str, transaction_id: str, now_ms: int) -> dict[str, Any] | None:
        """The answer given to this transaction, if answered within :data:`KEEP_MS`."""

        def txn(t: Transaction) -> dict[str, Any] | None:
            row = t.query_one(
                "SELECT response_json, received_ts FROM federation_received_transactions"
                " WHERE origin = ? AND transaction_id = ?",
                (origin, transaction_id),
            )
            if row is None or int(row[1]) < now_ms - KEEP_MS:
                return None
            answer: dict[str, Any] = orjson.loads(row[0])
            return answer

        return await self.db.run_interaction("federation_get_received_txn", txn)

    async def store(
        self, origin: str, transaction_id: str, answer: dict[str, Any], now_ms: int
    ) -> None:
        """Remember ``answer``; a second store of the same transaction replaces it."""
        encoded = orjson.dumps(answer).decode()

        def txn(t: Transaction) -> None:
            t.execute(
                "DELETE FROM federation_received_transactions"
                " WHERE origin = ? AND transaction_id = ?",
                (origin, transaction_id),
            )
            t.execute(
                "INSERT INTO federation_received_transactions"
                " (origin, transaction_id, response_json, received_ts) VALUES (?, ?, ?, ?)",
                (origin, transaction_id, encoded, now_ms),
            )
            expired = t.query(
                "SELECT origin, transaction_id FROM federation_received_transactions"
                " WHERE received_ts < ? LIMIT ?",
                (now_ms - KEEP_MS, PRUNE_BATCH),
            )
            for old_origin, old_id in expired:
                t.execute(
                    "DELETE FROM federation_received_transactions"
                    " WHERE origin = ? AND transaction_id = ?",
                    (old_origin, old_id),
                )

        await self.db.run_interaction("federation_store_received_txn", txn)
