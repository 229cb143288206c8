"""Per-user data on their streams: account data (global, per room, tags), read receipts,
to-device messages. Each write is one stream fact; readers ask for what changed after a
position of that stream.

The writes here are local: :class:`~roomstream.client.writes.UserDataWriter` calls them
on the process that writes the stream (``main`` unless configured) and forwards them
there from any other; called on a process that does not write the stream they answer
``400 M_UNKNOWN``.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import orjson

from roomstream.errors import BadRequestError
from roomstream.reading.relations import MAIN_TIMELINE, receipt_thread_txn, threads_of_txn
from roomstream.storage import Transaction
from roomstream.streams import StreamSet

__all__ = ["UserData"]

R = TypeVar("R")

#: To-device messages handed out per sync.
TO_DEVICE_LIMIT = 100
#: How long a ``/sendToDevice`` transaction ID is remembered (a retry after that is a
#: new message); older ones of a device are deleted when it sends again.
TO_DEVICE_TRANSACTION_KEPT_MS = 24 * 3600 * 1000

#: (sending device, transaction ID) of a ``PUT /sendToDevice``.
ToDeviceTransaction = tuple[str, str]


class UserData:
    def __init__(
        self, streams: StreamSet, instance_name: str, server_name: str | None = None
    ) -> None:
        """``server_name``: this server's, telling local recipients of to-device
        messages from other servers' (None: every recipient is taken as local)."""
        self.streams = streams
        self.db = streams.database
        self.instance_name = instance_name
        self.server_name = server_name

    def position(self, stream_name: str) -> int:
        """Every fact of the stream at or below this is complete (all writers)."""
        return self.streams.generator(stream_name).get_linear_position()

    def _writer(self, stream_name: str) -> Any:
        generator = self.streams.generator(stream_name)
        if not generator.is_writer():
            raise BadRequestError(f"{self.instance_name} does not write {stream_name}")
        return generator

    # -- account data ------------------------------------------------------------------

    async def put_account_data(
        self, user_id: str, room_id: str | None, data_type: str, content: Mapping[str, Any]
    ) -> int:
        raw = orjson.dumps(content).decode()
        instance = self.instance_name

        def txn(t: Transaction, ids: list[int]) -> None:
            if room_id is None:
                t.execute(
                    "INSERT INTO account_data"
                    " (stream_id, instance_name, user_id, account_data_type, content)"
                    " VALUES (?, ?, ?, ?, ?) ON CONFLICT (user_id, account_data_type)"
                    " DO UPDATE SET stream_id = excluded.stream_id,"
                    " instance_name = excluded.instance_name, content = excluded.content",
                    (ids[0], instance, user_id, data_type, raw),
                )
            else:
                t.execute(
                    "INSERT INTO room_account_data (stream_id, instance_name, user_id,"
                    " room_id, account_data_type, content) VALUES (?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT (user_id, room_id, account_data_type)"
                    " DO UPDATE SET stream_id = excluded.stream_id,"
                    " instance_name = excluded.instance_name, content = excluded.content",
                    (ids[0], instance, user_id, room_id, data_type, raw),
                )

        ids, _ = await self._writer("account_data").run_with_ids("put_account_data", 1, txn)
        return int(ids[0])

    async def get_account_data(
        self, user_id: str, room_id: str | None, data_type: str
    ) -> dict[str, Any] | None:
        if room_id is None:
            sql = "SELECT content FROM account_data WHERE user_id = ? AND account_data_type = ?"
            params: tuple[str, ...] = (user_id, data_type)
        else:
            sql = (
                "SELECT content FROM room_account_data"
                " WHERE user_id = ? AND room_id = ? AND account_data_type = ?"
            )
            params = (user_id, room_id, data_type)
        row = await self.db.run_interaction("get_account_data", lambda t: t.query_one(sql, params))
        if row is None:
            return None
        value = orjson.loads(row[0])
        return value if isinstance(value, dict) else None

    async def account_data_since(
        self, user_id: str, since: int, upto: int
    ) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, dict[str, Any]]]]:
        """(global type -> content, room -> type -> content) changed in ``(since, upto]``."""

        def txn(t: Transaction) -> Any:
            global_rows = t.query(
                "SELECT account_data_type, content FROM account_data"
                " WHERE user_id = ? AND stream_id > ? AND stream_id <= ?",
                (user_id, since, upto),
            )
            room_rows = t.query(
                "SELECT room_id, account_data_type, content FROM room_account_data"
                " WHERE user_id = ? AND stream_id > ? AND stream_id <= ?",
                (user_id, since, upto),
            )
            return global_rows, room_rows

        global_rows, room_rows = await self.db.run_interaction("account_data_since", txn)
        per_room: dict[str, dict[str, dict[str, Any]]] = {}
        for room_id, data_type, content in room_rows:
            per_room.setdefault(room_id, {})[data_type] = orjson.loads(content)
        return {r[0]: orjson.loads(r[1]) for r in global_rows}, per_room

    async def drop_device_inbox(self, user_id: str, device_id: str) -> None:
        """Forget every message queued for a deleted device (any process may: the rows
        only leave the table, the stream's facts stay)."""
        await self.db.run_interaction(
            "drop_device_inbox",
            lambda t: t.execute(
                "DELETE FROM device_inbox WHERE user_id = ? AND device_id = ?",
                (user_id, device_id),
            ),
        )

    # -- receipts ----------------------------------------------------------------------

    async def put_receipt(
        self,
        room_id: str,
        receipt_type: str,
        user_id: str,
        event_id: str,
        thread_id: str | None,
        ts: int | None = None,
    ) -> int:
        """Replace the user's receipt of this type (and thread) in the room; made at
        ``ts`` (ms since the epoch; None: now, as a local user's receipt is)."""
        made = int(time.time() * 1000) if ts is None else ts
        data = orjson.dumps({"ts": made}).decode()
        instance = self.instance_name

        def txn(t: Transaction, ids: list[int]) -> None:
            t.execute(
                "DELETE FROM receipts WHERE room_id = ? AND receipt_type = ? AND user_id = ?"
                " AND COALESCE(thread_id, '') = ?",
                (room_id, receipt_type, user_id, thread_id or ""),
            )
            t.execute(
                "INSERT INTO receipts (stream_id, instance_name, room_id, receipt_type,"
                " user_id, event_id, thread_id, data) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (ids[0], instance, room_id, receipt_type, user_id, event_id, thread_id, data),
            )

        ids, _ = await self._writer("receipts").run_with_ids("put_receipt", 1, txn)
        return int(ids[0])

    async def event_in_thread(self, room_id: str, event_id: str, thread_id: str) -> bool:
        """Whether a receipt on ``event_id`` may name ``thread_id`` (Synapse's
        ``_is_event_in_thread``): ``main`` for an event in no thread
        (:func:`~roomstream.reading.relations.threads_of_txn`), a thread root for the
        root, its replies and what relates to them
        (:func:`~roomstream.reading.relations.receipt_thread_txn`)."""
        if thread_id == MAIN_TIMELINE:
            found = await self.db.run_interaction("event_thread", threads_of_txn, [event_id])
            return event_id not in found
        found_thread = await self.db.run_interaction(
            "receipt_thread", receipt_thread_txn, room_id, event_id
        )
        return found_thread == thread_id

    async def receipts_since(
        self, room_ids: Sequence[str], since: int, upto: int
    ) -> dict[str, dict[str, Any]]:
        """room -> the ``m.receipt`` content of receipts in ``(since, upto]``."""
        if not room_ids:
            return {}
        rooms = list(room_ids)

        def txn(t: Transaction) -> list[Any]:
            rows: list[Any] = []
            for start in range(0, len(rooms), 500):
                chunk = rooms[start : start + 500]
                rows += t.query(
                    "SELECT room_id, receipt_type, user_id, event_id, thread_id, data"
                    f" FROM receipts WHERE room_id IN ({','.join('?' * len(chunk))})"
                    " AND stream_id > ? AND stream_id <= ?",
                    (*chunk, since, upto),
                )
            return rows

        result: dict[str, dict[str, Any]] = {}
        for (
            room_id,
            receipt_type,
            user_id,
            event_id,
            thread_id,
            data,
        ) in await self.db.run_interaction("receipts_since", txn):
            receipt = orjson.loads(data)
            if thread_id is not None:
                receipt["thread_id"] = thread_id
            content = result.setdefault(room_id, {})
            content.setdefault(event_id, {}).setdefault(receipt_type, {})[user_id] = receipt
        return result

    # -- to-device ---------------------------------------------------------------------

    async def send_to_device(
        self,
        sender: str,
        event_type: str,
        messages: Mapping[str, Mapping[str, Any]],
        transaction: ToDeviceTransaction | None = None,
    ) -> bool:
        """Queue messages for local devices (``*``: every device of the user), and for
        users of other servers one ``m.direct_to_device`` EDU per server in
        ``device_federation_outbox`` (the federation sender's to-device source, on the
        same stream); False if ``transaction`` (the sender's device and transaction ID)
        was sent before, and nothing was queued.

        Idempotent per (sender, device, transaction ID) on every engine and process: the
        transaction ID is inserted in the messages' own database transaction, and a
        concurrent duplicate waits on its primary key, then finds it (PostgreSQL), or
        runs after it (SQLite)."""
        instance = self.instance_name
        now_ms = int(time.time() * 1000)

        def txn(t: Transaction, ids: list[int]) -> bool:
            if transaction is not None and not _record_transaction(t, sender, transaction, now_ms):
                return False
            rows = []
            remote: dict[str, dict[str, Any]] = {}
            for user_id, by_device in messages.items():
                server = user_id.partition(":")[2]
                if self.server_name is not None and server != self.server_name:
                    remote.setdefault(server, {})[user_id] = dict(by_device)
                    continue
                devices = list(by_device)
                if "*" in by_device:
                    found = t.query("SELECT device_id FROM devices WHERE user_id = ?", (user_id,))
                    devices = [r[0] for r in found]
                for device_id in devices:
                    content = by_device.get(device_id, by_device.get("*"))
                    message = {"type": event_type, "sender": sender, "content": content}
                    rows.append((ids[0], instance, user_id, device_id, orjson.dumps(message)))
            t.executemany(
                "INSERT INTO device_inbox"
                " (stream_id, instance_name, user_id, device_id, message_json)"
                " VALUES (?, ?, ?, ?, ?)",
                [(*r[:4], r[4].decode()) for r in rows],
            )
            if remote:
                t.executemany(
                    "INSERT INTO device_federation_outbox"
                    " (stream_id, instance_name, destination, message_id, messages_json)"
                    " VALUES (?, ?, ?, ?, ?)",
                    [
                        (ids[0], instance, server, message_id, edu)
                        for server, by_user in sorted(remote.items())
                        for message_id, edu in [_direct_to_device(sender, event_type, by_user)]
                    ],
                )
            return True

        _, sent = await self._writer("to_device").run_with_ids("send_to_device", 1, txn)
        return bool(sent)

    async def to_device_messages(
        self,
        user_id: str,
        device_id: str,
        acknowledged: int,
        upto: int,
        also: Callable[[Transaction], R] | None = None,
    ) -> tuple[list[dict[str, Any]], int, R | None]:
        """Delete the device's messages up to ``acknowledged`` (the client has them: it
        synced from there), then return the next ones up to ``upto``, with the position
        to acknowledge them by, and what ``also`` (another read the caller needs now, in
        the same transaction: one round trip for both) returned."""

        def txn(t: Transaction) -> tuple[list[Any], int, R | None]:
            t.execute(
                "DELETE FROM device_inbox WHERE user_id = ? AND device_id = ? AND stream_id <= ?",
                (user_id, device_id, acknowledged),
            )
            rows = t.query(
                "SELECT stream_id, message_json FROM device_inbox"
                " WHERE user_id = ? AND device_id = ? AND stream_id <= ?"
                f" ORDER BY stream_id LIMIT {TO_DEVICE_LIMIT + 1}",
                (user_id, device_id, upto),
            )
            end = upto
            if len(rows) > TO_DEVICE_LIMIT:
                end = int(rows[TO_DEVICE_LIMIT][0]) - 1
                rows = [r for r in rows if int(r[0]) <= end]
            extra = None if also is None else also(t)
            return [orjson.loads(r[1]) for r in rows], end, extra

        return await self.db.run_interaction("to_device_messages", txn)


def _record_transaction(
    t: Transaction, sender: str, transaction: ToDeviceTransaction, now_ms: int
) -> bool:
    """Record the sender's transaction ID; False if it was there already."""
    device_id, txn_id = transaction
    t.execute(
        "DELETE FROM to_device_transactions WHERE user_id = ? AND device_id = ? AND created_ts < ?",
        (sender, device_id, now_ms - TO_DEVICE_TRANSACTION_KEPT_MS),
    )
    t.execute(
        "INSERT INTO to_device_transactions (user_id, device_id, txn_id, created_ts)"
        " VALUES (?, ?, ?, ?) ON CONFLICT (user_id, device_id, txn_id) DO NOTHING",
        (sender, device_id, txn_id, now_ms),
    )
    return t.rowcount == 1


def _direct_to_device(sender: str, event_type: str, messages: Mapping[str, Any]) -> tuple[str, str]:
    """(message ID, the ``m.direct_to_device`` EDU content as JSON) of messages to the
    users of one other server; the ID lets that server drop a repeat."""
    message_id = secrets.token_urlsafe(12)
    content = {
        "sender": sender,
        "type": event_type,
        "message_id": message_id,
        "messages": messages,
    }
    return message_id, orjson.dumps(content).decode()
