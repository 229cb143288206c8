"""The ``receipts`` section: ``m.receipt`` ephemeral events of joined rooms, from the
``receipts`` stream."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from roomstream.client.sync_sections.base import SyncContext, UserDataSection, room_key
from roomstream.streams.rows import ReceiptsRow

__all__ = ["ReceiptsSection"]


class ReceiptsSection(UserDataSection):
    name = "receipts"
    stream = "receipts"

    @staticmethod
    def wake_keys(row: Sequence[Any]) -> list[str]:
        return [room_key(str(ReceiptsRow.from_wire(row).room_id))]

    async def collect(self, ctx: SyncContext, since: int | None, upto: int) -> int:
        since = 0 if ctx.initial or since is None else since
        if upto <= since:
            return upto
        joined = await ctx.joined_rooms()
        receipts = await self.userdata.receipts_since(joined, since, upto)
        for room_id, content in receipts.items():
            ctx.room_ephemeral.setdefault(room_id, []).append(
                {"type": "m.receipt", "content": content}
            )
        return upto
