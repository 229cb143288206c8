"""The ``to_device`` section: the device's to-device inbox, from the ``to_device``
stream. The token's part is what the device acknowledged: the messages up to it are
deleted by the next sync that carries it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from roomstream.client.sync_sections.base import (
    SyncContext,
    UserDataSection,
    events,
    user_key,
)
from roomstream.client.userdata import UserData
from roomstream.streams.rows import ToDeviceRow

__all__ = ["ToDeviceSection"]

#: Devices whose cleared position is remembered (past it the oldest is forgotten: its
#: next sync clears again, one statement more).
MAX_CLEARED_DEVICES = 100_000


class ToDeviceSection(UserDataSection):
    name = "to_device"
    stream = "to_device"

    def __init__(self, userdata: UserData) -> None:
        super().__init__(userdata)
        #: (user, device) -> the to-device position up to which its inbox was cleared.
        self._cleared: dict[tuple[str, str], int] = {}

    @staticmethod
    def wake_keys(row: Sequence[Any]) -> list[str]:
        # Rows for a remote server (federation outbox) wake nobody here.
        user_id = ToDeviceRow.from_wire(row).local_user_id
        return [] if user_id is None else [user_key(user_id)]

    async def collect(self, ctx: SyncContext, since: int | None, upto: int) -> int:
        acknowledged = 0 if since is None else since
        device_key = (ctx.user_id, ctx.device_id)
        if upto <= acknowledged and self._cleared.get(device_key) == acknowledged:
            return acknowledged
        messages, end = await self.userdata.to_device_messages(
            ctx.user_id, ctx.device_id, acknowledged, upto
        )
        self._cleared[device_key] = acknowledged
        if len(self._cleared) > MAX_CLEARED_DEVICES:
            self._cleared.pop(next(iter(self._cleared)))
        ctx.body["to_device"] = events(messages)
        if messages:
            ctx.has_news = True
        return end
