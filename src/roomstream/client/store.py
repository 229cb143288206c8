"""SQL for the Client-Server API's own records (migration 0006): filters, room aliases,
forgotten rooms, the directory flag. (Transaction IDs live with the read path, which
shows them to the sending device.)"""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from roomstream.rooms.persist import set_room_public_txn
from roomstream.storage import Database, Transaction

__all__ = ["ClientStore"]


class ClientStore:
    def __init__(self, database: Database) -> None:
        self.db = database

    # -- filters -----------------------------------------------------------------------

    async def add_filter(self, user_id: str, definition: dict[str, object]) -> int:
        raw = orjson.dumps(definition).decode()

        def txn(t: Transaction) -> int:
            row = t.query_one(
                "SELECT MAX(filter_id) FROM user_filters WHERE user_id = ?", (user_id,)
            )
            filter_id = 0 if row is None or row[0] is None else int(row[0]) + 1
            t.execute(
                "INSERT INTO user_filters (user_id, filter_id, filter_json) VALUES (?, ?, ?)",
                (user_id, filter_id, raw),
            )
            return filter_id

        return await self.db.run_interaction("add_filter", txn)

    async def get_filter(self, user_id: str, filter_id: int) -> dict[str, object] | None:
        row = await self.db.run_interaction(
            "get_filter",
            lambda t: t.query_one(
                "SELECT filter_json FROM user_filters WHERE user_id = ? AND filter_id = ?",
                (user_id, filter_id),
            ),
        )
        if row is None:
            return None
        value = orjson.loads(row[0])
        return value if isinstance(value, dict) else None

    # -- room aliases ------------------------------------------------------------------

    async def create_alias(self, alias: str, room_id: str, creator: str) -> bool:
        """False if the alias is taken."""

        def txn(t: Transaction) -> bool:
            if t.query_one("SELECT 1 FROM room_aliases WHERE room_alias = ?", (alias,)):
                return False
            t.execute(
                "INSERT INTO room_aliases (room_alias, room_id, creator) VALUES (?, ?, ?)",
                (alias, room_id, creator),
            )
            return True

        return await self.db.run_interaction("create_alias", txn)

    async def get_alias(self, alias: str) -> tuple[str, str] | None:
        """(room ID, creator) of an alias."""
        row = await self.db.run_interaction(
            "get_alias",
            lambda t: t.query_one(
                "SELECT room_id, creator FROM room_aliases WHERE room_alias = ?", (alias,)
            ),
        )
        return None if row is None else (str(row[0]), str(row[1]))

    async def delete_alias(self, alias: str) -> None:
        await self.db.run_interaction(
            "delete_alias",
            lambda t: t.execute("DELETE FROM room_aliases WHERE room_alias = ?", (alias,)),
        )

    async def get_aliases(self, room_id: str) -> list[str]:
        rows = await self.db.run_interaction(
            "get_aliases",
            lambda t: t.query(
                "SELECT room_alias FROM room_aliases WHERE room_id = ? ORDER BY room_alias",
                (room_id,),
            ),
        )
        return [str(r[0]) for r in rows]

    async def move_aliases(self, old_room_id: str, new_room_id: str) -> None:
        """Point every alias of one room at another (a room upgrade)."""
        await self.db.run_interaction(
            "move_aliases",
            lambda t: t.execute(
                "UPDATE room_aliases SET room_id = ? WHERE room_id = ?", (new_room_id, old_room_id)
            ),
        )

    # -- forgotten rooms ---------------------------------------------------------------

    async def forget(self, user_id: str, room_id: str) -> None:
        await self.db.run_interaction(
            "forget_room",
            lambda t: t.execute(
                "INSERT INTO room_forgotten (user_id, room_id) VALUES (?, ?)"
                " ON CONFLICT (user_id, room_id) DO NOTHING",
                (user_id, room_id),
            ),
        )

    async def unforget(self, user_id: str, room_id: str) -> None:
        await self.db.run_interaction(
            "unforget_room",
            lambda t: t.execute(
                "DELETE FROM room_forgotten WHERE user_id = ? AND room_id = ?", (user_id, room_id)
            ),
        )

    async def forgotten_rooms(self, user_id: str, room_ids: Sequence[str]) -> set[str]:
        if not room_ids:
            return set()
        rows = await self.db.run_interaction(
            "forgotten_rooms",
            lambda t: t.query("SELECT room_id FROM room_forgotten WHERE user_id = ?", (user_id,)),
        )
        wanted = set(room_ids)
        return {str(r[0]) for r in rows} & wanted

    # -- the room directory ------------------------------------------------------------

    async def is_room_public(self, room_id: str) -> bool:
        """Whether the room is published in the room directory."""
        row = await self.db.run_interaction(
            "is_room_public",
            lambda t: t.query_one("SELECT is_public FROM rooms WHERE room_id = ?", (room_id,)),
        )
        return row is not None and bool(row[0])

    async def set_room_public(self, room_id: str, public: bool) -> None:
        # The rooms table's one writer is the persister's module (storage/owners.py).
        await self.db.run_interaction("set_room_public", set_room_public_txn, room_id, public)
