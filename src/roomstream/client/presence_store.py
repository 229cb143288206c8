"""The ``presence`` stream's table, ``presence_stream`` (written only here), and the reads
of it: a user's presence now, the changes between two positions, who shares a room.

The table holds one row per user: writing a user's new state deletes their older rows
in the same transaction (Synapse's ``presence_stream`` does the same), so it is both the
stream and every user's current state; a user with no row is offline and never active.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from roomstream.client.presence import OFFLINE, UserPresence
from roomstream.e2e.device_lists import shares_room_with_txn
from roomstream.storage import Database, Transaction
from roomstream.streams import StreamIdGenerator

__all__ = ["PresenceStore"]

_COLUMNS = (
    "user_id, state, last_active_ts, last_federation_update_ts, last_user_sync_ts,"
    " status_msg, currently_active"
)


def _state(row: Sequence[object]) -> UserPresence:
    return UserPresence(
        str(row[0]),
        str(row[1]),
        int(str(row[2])),
        int(str(row[3])),
        int(str(row[4])),
        None if row[5] is None else str(row[5]),
        bool(row[6]),
    )


class PresenceStore:
    def __init__(self, database: Database, stream: StreamIdGenerator) -> None:
        self.db = database
        self.stream = stream

    def position(self) -> int:
        """Every ``presence`` fact at or below this is complete."""
        return self.stream.get_linear_position()

    async def persist(self, states: Sequence[UserPresence]) -> int:
        """Write the states (one stream ID each, a user's older rows deleted); the last
        ID. Only on the stream's writer."""
        instance = self.stream.instance_name

        def txn(t: Transaction, ids: list[int]) -> int:
            users = sorted({s.user_id for s in states})
            for start in range(0, len(users), 500):
                chunk = users[start : start + 500]
                marks = ", ".join("?" for _ in chunk)
                t.execute(f"DELETE FROM presence_stream WHERE user_id IN ({marks})", chunk)
            t.executemany(
                f"INSERT INTO presence_stream (stream_id, instance_name, {_COLUMNS})"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(stream_id, instance, *s) for stream_id, s in zip(ids, states, strict=True)],
            )
            return ids[-1]

        _, last = await self.stream.run_with_ids("persist_presence", len(states), txn)
        return last

    async def current(self, user_ids: Iterable[str]) -> dict[str, UserPresence]:
        """The users' presence now (offline and never active for a user with no row)."""
        wanted = sorted(set(user_ids))

        def txn(t: Transaction) -> dict[str, UserPresence]:
            found = {u: UserPresence(u) for u in wanted}
            for start in range(0, len(wanted), 500):
                chunk = wanted[start : start + 500]
                marks = ", ".join("?" for _ in chunk)
                for row in t.query(
                    f"SELECT {_COLUMNS} FROM presence_stream WHERE user_id IN ({marks})"
                    " ORDER BY stream_id",
                    chunk,
                ):
                    found[str(row[0])] = _state(row)
            return found

        return await self.db.run_interaction("presence_current", txn)

    async def not_offline(self) -> list[UserPresence]:
        """Every user whose stored presence is not offline (restored at start)."""

        def txn(t: Transaction) -> list[UserPresence]:
            rows = t.query(
                f"SELECT {_COLUMNS} FROM presence_stream WHERE state != ? ORDER BY stream_id",
                (OFFLINE,),
            )
            return [_state(r) for r in rows]

        return await self.db.run_interaction("presence_restore", txn)

    async def for_sync(self, user_id: str, since: int | None, upto: int) -> list[UserPresence]:
        """What a sync of ``user_id`` shows: the presence of the users sharing a room with
        them (and their own) that changed in ``(since, upto]``; with no ``since`` (an
        initial sync), the presence of every such user who is not offline."""

        def txn(t: Transaction) -> list[UserPresence]:
            if since is None:
                rows = t.query(
                    f"SELECT {_COLUMNS} FROM presence_stream"
                    " WHERE state != ? AND stream_id <= ? ORDER BY stream_id",
                    (OFFLINE, upto),
                )
            else:
                rows = t.query(
                    f"SELECT {_COLUMNS} FROM presence_stream"
                    " WHERE stream_id > ? AND stream_id <= ? ORDER BY stream_id",
                    (since, upto),
                )
            states = [_state(r) for r in rows]
            if not states:
                return []
            visible = shares_room_with_txn(t, user_id, {s.user_id for s in states})
            return [s for s in states if s.user_id in visible]

        return await self.db.run_interaction("presence_for_sync", txn)

    async def visible_to(self, observer: str, observed: str) -> bool:
        """Whether ``observer`` may see ``observed``'s presence: themself, or someone
        sharing a room with them (Synapse's ``is_visible``)."""

        def txn(t: Transaction) -> bool:
            return observed in shares_room_with_txn(t, observer, [observed])

        return await self.db.run_interaction("presence_visible", txn)
