"""The ``to_device`` section: the device's to-device inbox, from the ``to_device``
stream. The token's part is what the device acknowledged: the messages up to it are
deleted by the next sync that carries it."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Self

from roomstream.client.sync_sections.base import (
    SyncContext,
    SyncServices,
    UserDataSection,
    events,
    user_key,
)
from roomstream.client.userdata import UserData
from roomstream.e2e import E2eKeys
from roomstream.e2e.service import key_status_txn
from roomstream.streams.rows import ToDeviceRow

__all__ = ["ToDeviceSection"]

#: Devices whose cleared position is remembered (past it the oldest is forgotten: its
#: next sync clears again, one statement more).
MAX_CLEARED_DEVICES = 100_000


class ToDeviceSection(UserDataSection):
    name = "to_device"
    stream = "to_device"

    def __init__(self, userdata: UserData, keys: E2eKeys | None = None) -> None:
        """``keys``: end-to-end encryption (None: none); with it, the device's key status
        is read with its messages (see :attr:`SyncContext.key_status`)."""
        super().__init__(userdata)
        self.keys = keys
        #: (user, device) -> the to-device position up to which its inbox was cleared.
        self._cleared: dict[tuple[str, str], int] = {}

    @classmethod
    def from_services(cls, services: SyncServices) -> Self:
        return cls(services.userdata, services.keys)

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
        # The device lists section (later in this build) needs the key status: read it
        # here, in the same transaction, rather than in a round trip of its own.
        also = None
        if self.keys is not None:
            also = functools.partial(key_status_txn, user_id=ctx.user_id, device_id=ctx.device_id)
        messages, end, key_status = await self.userdata.to_device_messages(
            ctx.user_id, ctx.device_id, acknowledged, upto, also
        )
        ctx.key_status = key_status
        self._cleared[device_key] = acknowledged
        if len(self._cleared) > MAX_CLEARED_DEVICES:
            self._cleared.pop(next(iter(self._cleared)))
        ctx.body["to_device"] = events(messages)
        if messages:
            ctx.has_news = True
        return end
