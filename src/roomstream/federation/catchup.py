"""The federation sender's tables (migration 0026): stream positions, destinations' back-off
and catch-up records. The one writer of ``federation_stream_position``, ``destinations``
and ``destination_rooms``.

Why these rows make restarts safe (see ``docs/federation/sender.md``): the sender stores,
in one transaction, the ``destination_rooms`` rows of a batch of events and its new
``events`` position, before it queues the batch; a destination's
``last_successful_stream_ordering`` moves only after a transaction carrying those PDUs was
accepted. After a restart (or a failure), a destination whose ``destination_rooms`` hold
a stream ordering above its ``last_successful_stream_ordering`` has missed events, and
catch-up sends each such room's newest event: nothing accepted is sent again, and no room
is forgotten.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from roomstream.federation.destination_queue import RetryState
from roomstream.storage import Database, Transaction

__all__ = ["CatchUpRow", "DestinationRecord", "FederationSenderStore"]


@dataclass(frozen=True)
class DestinationRecord:
    """A ``destinations`` row, with whether it has missed events (``needs_catch_up``)."""

    destination: str
    retry: RetryState
    last_successful_stream_ordering: int | None
    needs_catch_up: bool


@dataclass(frozen=True)
class CatchUpRow:
    """A room's newest event for a destination (from ``destination_rooms``)."""

    room_id: str
    event_id: str
    stream_ordering: int


class FederationSenderStore:
    """Named transactions over the sender's tables (both engines, ``?`` placeholders)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    # -- stream positions ----------------------------------------------------------------

    async def get_position(self, instance_name: str, stream_name: str) -> int | None:
        def txn(t: Transaction) -> int | None:
            row = t.query_one(
                "SELECT stream_id FROM federation_stream_position"
                " WHERE type = ? AND instance_name = ?",
                (stream_name, instance_name),
            )
            return None if row is None else int(row[0])

        return await self.db.run_interaction("federation_sender_get_position", txn)

    async def set_position(self, instance_name: str, stream_name: str, position: int) -> None:
        await self.db.run_interaction(
            "federation_sender_set_position",
            _set_position_txn,
            instance_name,
            stream_name,
            position,
        )

    async def record_events(
        self,
        instance_name: str,
        rows: Sequence[tuple[str, str, int]],
        position: int,
    ) -> None:
        """Store ``(destination, room_id, stream_ordering)`` rows (the newest per pair
        wins) and the new ``events`` position, in one transaction."""

        def txn(t: Transaction) -> None:
            newest: dict[tuple[str, str], int] = {}
            for destination, room_id, ordering in rows:
                key = (destination, room_id)
                newest[key] = max(ordering, newest.get(key, ordering))
            for (destination, room_id), ordering in sorted(newest.items()):
                t.execute(
                    "INSERT INTO destination_rooms (destination, room_id, stream_ordering)"
                    " VALUES (?, ?, ?) ON CONFLICT (destination, room_id) DO UPDATE"
                    " SET stream_ordering = excluded.stream_ordering"
                    " WHERE destination_rooms.stream_ordering < excluded.stream_ordering",
                    (destination, room_id, ordering),
                )
            for destination in sorted({d for d, _ in newest}):
                t.execute(
                    "INSERT INTO destinations (destination) VALUES (?)"
                    " ON CONFLICT (destination) DO NOTHING",
                    (destination,),
                )
            _set_position_txn(t, instance_name, "events", position)

        await self.db.run_interaction("federation_sender_record_events", txn)

    # -- destinations --------------------------------------------------------------------

    async def get_destinations(
        self, destinations: Iterable[str] | None = None
    ) -> list[DestinationRecord]:
        """Every ``destinations`` row (or those named), with ``needs_catch_up``."""
        wanted = None if destinations is None else set(destinations)

        def txn(t: Transaction) -> list[DestinationRecord]:
            rows = t.query(
                "SELECT d.destination, d.failure_ts, d.retry_last_ts, d.retry_interval,"
                " d.last_successful_stream_ordering,"
                " (SELECT MAX(r.stream_ordering) FROM destination_rooms AS r"
                "  WHERE r.destination = d.destination)"
                " FROM destinations AS d ORDER BY d.destination"
            )
            result = []
            for name, failure_ts, last_ts, interval, last_ok, newest in rows:
                if wanted is not None and name not in wanted:
                    continue
                last = None if last_ok is None else int(last_ok)
                result.append(
                    DestinationRecord(
                        str(name),
                        RetryState(
                            None if failure_ts is None else int(failure_ts),
                            int(last_ts),
                            int(interval),
                        ),
                        last,
                        newest is not None and (last is None or int(newest) > last),
                    )
                )
            return result

        return await self.db.run_interaction("federation_sender_get_destinations", txn)

    async def set_retry(self, destination: str, retry: RetryState) -> None:
        def txn(t: Transaction) -> None:
            _ensure_destination(t, destination)
            t.execute(
                "UPDATE destinations SET failure_ts = ?, retry_last_ts = ?, retry_interval = ?"
                " WHERE destination = ?",
                (retry.failure_ts, retry.retry_last_ts, retry.retry_interval, destination),
            )

        await self.db.run_interaction("federation_sender_set_retry", txn)

    async def record_success(
        self,
        destination: str,
        last_successful: int | None,
        to_device_upto: int | None = None,
    ) -> None:
        """A transaction was accepted: clear the back-off and store the newest stream
        ordering the destination has and how far it has its to-device messages (neither
        ever moving back)."""

        def txn(t: Transaction) -> None:
            _ensure_destination(t, destination)
            t.execute(
                "UPDATE destinations SET failure_ts = NULL, retry_last_ts = 0,"
                " retry_interval = 0 WHERE destination = ?",
                (destination,),
            )
            if last_successful is not None:
                t.execute(
                    "UPDATE destinations SET last_successful_stream_ordering = ?"
                    " WHERE destination = ? AND (last_successful_stream_ordering IS NULL"
                    " OR last_successful_stream_ordering < ?)",
                    (last_successful, destination, last_successful),
                )
            if to_device_upto is not None:
                _advance_to_device_txn(t, destination, to_device_upto)

        await self.db.run_interaction("federation_sender_record_success", txn)

    # -- to-device messages ------------------------------------------------------------------

    async def note_to_device(self, first_ids: Mapping[str, int]) -> None:
        """Before queueing a destination's first to-device messages: it has everything
        below ``first_ids[destination]`` (a destination that already has a record keeps
        it)."""

        def txn(t: Transaction) -> None:
            for destination, first in sorted(first_ids.items()):
                t.execute(
                    "INSERT INTO federation_stream_position (type, instance_name, stream_id)"
                    " VALUES (?, ?, ?) ON CONFLICT (type, instance_name) DO NOTHING",
                    (TO_DEVICE_ACCEPTED + destination, ANY_SENDER, first - 1),
                )

        await self.db.run_interaction("federation_sender_note_to_device", txn)

    async def get_unsent_to_device(self, upto: int) -> list[tuple[str, int, str]]:
        """``(destination, stream_id, messages_json)`` of the outbox up to ``upto`` that
        the destinations have not accepted yet, ascending."""

        def txn(t: Transaction) -> list[tuple[str, int, str]]:
            rows = t.query(
                "SELECT o.destination, o.stream_id, o.messages_json"
                " FROM device_federation_outbox AS o"
                " JOIN federation_stream_position AS p"
                " ON p.type = ? || o.destination AND p.instance_name = ?"
                " WHERE o.stream_id > p.stream_id AND o.stream_id <= ?"
                " ORDER BY o.stream_id",
                (TO_DEVICE_ACCEPTED, ANY_SENDER, upto),
            )
            return [(str(r[0]), int(r[1]), str(r[2])) for r in rows]

        return await self.db.run_interaction("federation_sender_unsent_to_device", txn)

    # -- catch-up --------------------------------------------------------------------------

    async def get_catch_up_rows(
        self, destination: str, after: int | None, limit: int
    ) -> list[CatchUpRow]:
        """Per room, the newest event for ``destination`` with a stream ordering above
        ``after`` (None: any), oldest first, at most ``limit`` rooms."""

        def txn(t: Transaction) -> list[CatchUpRow]:
            rows = t.query(
                "SELECT r.room_id, e.event_id, r.stream_ordering"
                " FROM destination_rooms AS r"
                " JOIN events AS e ON e.stream_ordering = r.stream_ordering"
                " WHERE r.destination = ? AND r.stream_ordering > ?"
                " ORDER BY r.stream_ordering LIMIT ?",
                (destination, -(2**62) if after is None else after, limit),
            )
            return [CatchUpRow(str(r[0]), str(r[1]), int(r[2])) for r in rows]

        return await self.db.run_interaction("federation_sender_catch_up_rows", txn)

    async def next_txn_epoch(self) -> int:
        """A number no earlier start of any sender instance had (transaction IDs)."""

        def txn(t: Transaction) -> int:
            return t.nextval_many("federation_txn_epoch_seq", 1)[0]

        return await self.db.run_interaction("federation_sender_txn_epoch", txn)


def _set_position_txn(t: Transaction, instance_name: str, stream_name: str, position: int) -> None:
    t.execute(
        "INSERT INTO federation_stream_position (type, instance_name, stream_id)"
        " VALUES (?, ?, ?) ON CONFLICT (type, instance_name)"
        " DO UPDATE SET stream_id = excluded.stream_id",
        (stream_name, instance_name, position),
    )


#: ``federation_stream_position`` rows recording, per destination, the ``to_device``
#: stream ID up to which it has accepted its outbox messages: ``type`` is this prefix and
#: the destination, ``instance_name`` is :data:`ANY_SENDER` (the record is the
#: destination's, whichever sender instance sends to it). Kept in that table rather than
#: in a column of ``destinations`` because migration 0026 had shipped without one.
TO_DEVICE_ACCEPTED = "to_device_accepted|"
ANY_SENDER = "*"


def _advance_to_device_txn(t: Transaction, destination: str, upto: int) -> None:
    t.execute(
        "INSERT INTO federation_stream_position (type, instance_name, stream_id)"
        " VALUES (?, ?, ?) ON CONFLICT (type, instance_name) DO UPDATE"
        " SET stream_id = excluded.stream_id"
        " WHERE federation_stream_position.stream_id < excluded.stream_id",
        (TO_DEVICE_ACCEPTED + destination, ANY_SENDER, upto),
    )


def _ensure_destination(t: Transaction, destination: str) -> None:
    t.execute(
        "INSERT INTO destinations (destination) VALUES (?) ON CONFLICT (destination) DO NOTHING",
        (destination,),
    )
