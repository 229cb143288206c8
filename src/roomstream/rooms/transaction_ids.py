"""The transaction-ID records of sends (table ``event_txn_ids``), the write path's.

This module is the table's one writer (``roomstream.storage.owners``). A device's send
with a transaction ID is recorded in the event's own persist transaction (the persister
calls :func:`record_txn`), so that a retry of the send finds its event and that device,
only, is shown its transaction ID (the read path's formatter reads the records). A
conflict can only come from a send of the same transaction persisted by another writer
(ownership moved mid-flight): the first record is kept.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from roomstream.storage import Database, Transaction

__all__ = ["TransactionIds", "TransactionKey", "record_txn"]

#: (user ID, device ID, transaction ID) of a local send.
TransactionKey = tuple[str, str, str]


def record_txn(
    txn: Transaction, room_id: str, records: Mapping[str, TransactionKey], now_ms: int
) -> None:
    """Record ``records`` (event ID -> who sent it with which transaction ID) of the
    room's events, in the caller's transaction; a record already there is kept."""
    txn.executemany(
        "INSERT INTO event_txn_ids"
        " (event_id, room_id, user_id, device_id, txn_id, inserted_ts)"
        " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
        [
            (event_id, room_id, user_id, device_id, txn_id, now_ms)
            for event_id, (user_id, device_id, txn_id) in records.items()
        ],
    )


class TransactionIds:
    """The records of sends, for the layers above (idempotent sends of the client API)."""

    def __init__(self, db: Database, *, clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self._clock = clock

    async def record_transaction_id(
        self, event_id: str, room_id: str, user_id: str, device_id: str, txn_id: str
    ) -> None:
        """Remember that ``device_id`` of ``user_id`` sent ``event_id`` with ``txn_id``
        (shown to that device only). The client API does not call this: its sends store
        the record in the event's own transaction (``EventPersister``)."""
        now = int(self._clock() * 1000)
        records = {event_id: (user_id, device_id, txn_id)}
        await self.db.run_interaction(
            "record_transaction_id", lambda t: record_txn(t, room_id, records, now)
        )

    async def transactions_of_device(
        self, room_id: str, user_id: str, device_id: str, limit: int
    ) -> dict[str, str] | None:
        """Transaction ID -> event ID of every send of this device in the room; None if
        there are more than ``limit``."""
        rows = await self.db.run_interaction(
            "transactions_of_device",
            lambda t: t.query(
                "SELECT txn_id, event_id FROM event_txn_ids WHERE room_id = ? AND user_id = ?"
                " AND device_id = ? LIMIT ?",
                (room_id, user_id, device_id, limit + 1),
            ),
        )
        if len(rows) > limit:
            return None
        return {str(r[0]): str(r[1]) for r in rows}

    async def event_for_transaction(
        self, room_id: str, user_id: str, device_id: str, txn_id: str
    ) -> str | None:
        """The event a device already sent with this transaction ID (idempotent sends)."""
        row = await self.db.run_interaction(
            "event_for_transaction",
            lambda t: t.query_one(
                "SELECT event_id FROM event_txn_ids WHERE room_id = ? AND user_id = ?"
                " AND device_id = ? AND txn_id = ?",
                (room_id, user_id, device_id, txn_id),
            ),
        )
        return None if row is None else str(row[0])
