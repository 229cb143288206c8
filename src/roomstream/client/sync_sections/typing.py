"""The ``typing`` section: ``m.typing`` ephemeral events of joined rooms, from the
in-memory ``typing`` stream (:class:`~roomstream.client.typing.TypingState`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self

from roomstream.client.sync_sections.base import SyncContext, SyncSection, SyncServices, room_key
from roomstream.client.typing import TypingState
from roomstream.streams.rows import TypingRow

__all__ = ["TypingSection"]


class TypingSection(SyncSection):
    name = "typing"
    stream = "typing"

    def __init__(self, typing: TypingState) -> None:
        self.typing = typing

    @classmethod
    def from_services(cls, services: SyncServices) -> Self:
        return cls(services.typing)

    @staticmethod
    def wake_keys(row: Sequence[Any]) -> list[str]:
        return [room_key(str(TypingRow.from_wire(row).room_id))]

    def current_position(self) -> int:
        return self.typing.token

    async def collect(self, ctx: SyncContext, since: int | None, upto: int) -> int:
        # -1: every room with someone typing (the writer's tokens start at 0 after a
        # restart, so 0 would miss its first rows).
        since = -1 if ctx.initial or since is None else since
        if upto == since:
            return upto
        typing = self.typing.changed(await ctx.joined_rooms(), since)
        for room_id, user_ids in typing.items():
            ctx.room_ephemeral.setdefault(room_id, []).append(
                {"type": "m.typing", "content": {"user_ids": user_ids}}
            )
        return upto
