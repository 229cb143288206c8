"""The ``presence`` section: ``m.presence`` events of the users sharing a room with the
syncing user (and the user's own), from the ``presence`` stream's table
(:class:`~roomstream.client.presence_store.PresenceStore`).

As Synapse: an initial sync carries every such user who is not offline; an incremental
one every such user whose presence changed since the token (going offline included).
A change wakes the syncs of the user and of everyone sharing a room with them
(:func:`~roomstream.client.sync_sections.base.sharers_key`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Self

from roomstream.client.presence_store import PresenceStore
from roomstream.client.sync_sections.base import (
    SyncContext,
    SyncSection,
    SyncServices,
    sharers_key,
    user_key,
)
from roomstream.streams.rows import PresenceRow

__all__ = ["PresenceSection"]


class PresenceSection(SyncSection):
    name = "presence"
    stream = "presence"

    def __init__(self, store: PresenceStore | None) -> None:
        self.store = store

    @classmethod
    def from_services(cls, services: SyncServices) -> Self:
        return cls(services.presence)

    @staticmethod
    def wake_keys(row: Sequence[Any]) -> list[str]:
        # The user's own syncs and those of everyone sharing a room with them.
        user_id = PresenceRow.from_wire(row).user_id
        return [user_key(user_id), sharers_key(user_id)]

    def current_position(self) -> int:
        return 0 if self.store is None else self.store.position()

    async def collect(self, ctx: SyncContext, since: int | None, upto: int) -> int:
        if self.store is None:
            return upto
        since = None if ctx.initial else since
        if since is not None and since >= upto:
            return upto
        states = await self.store.for_sync(ctx.user_id, since, upto)
        now = int(time.time() * 1000)
        events = ctx.filter.presence.apply(
            {"type": "m.presence", "sender": s.user_id, "content": s.content(now)} for s in states
        )
        ctx.body["presence"] = {"events": events}
        if events:
            ctx.has_news = True
        return upto
