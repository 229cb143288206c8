"""The ``device_lists`` section: end-to-end encryption's part of ``/sync``, from the
``device_lists`` stream.

- ``device_lists.changed``: users sharing a room with the syncing user (and the user
  themself) whose devices or keys changed since the token, and users who came to share a
  room with them since (none in an initial sync: the client queries the keys it needs);
  ``left``: users whose membership moved since the token and who share no room with the
  syncing user now (see :meth:`roomstream.e2e.E2eKeys.changed_since`);
- ``device_one_time_keys_count`` and ``device_unused_fallback_key_types``: the syncing
  device's key stock, in every answer (a client tops it up from these).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self

from roomstream.client.sync_sections.base import (
    SyncContext,
    SyncSection,
    SyncServices,
    sharers_key,
    user_key,
)
from roomstream.e2e import E2eKeys
from roomstream.streams.rows import DeviceListsRow

__all__ = ["DeviceListsSection"]


class DeviceListsSection(SyncSection):
    name = "device_lists"
    stream = "device_lists"

    def __init__(self, keys: E2eKeys | None) -> None:
        self.keys = keys

    @classmethod
    def from_services(cls, services: SyncServices) -> Self:
        return cls(services.keys)

    @staticmethod
    def wake_keys(row: Sequence[Any]) -> list[str]:
        # The user's own syncs, and everyone sharing a room with them: their clients must
        # re-query the keys before they next encrypt for a shared room (a new device
        # missed there cannot read what is sent meanwhile).
        user_id = DeviceListsRow.from_wire(row).user_id
        return [user_key(user_id), sharers_key(user_id)]

    def current_position(self) -> int:
        return 0 if self.keys is None else self.keys.position()

    async def collect(self, ctx: SyncContext, since: int | None, upto: int) -> int:
        if self.keys is None:
            ctx.body["device_unused_fallback_key_types"] = []
            return upto
        changed: set[str] = set()
        left: set[str] = set()
        moved = ctx.membership_range
        if since is not None and (upto > since or moved is not None):
            changed, left = await self.keys.changed_since(
                ctx.user_id, since, max(since, upto), membership_range=moved
            )
        if ctx.key_status is not None:  # read with the to-device messages, this build
            counts, fallbacks = ctx.key_status
        else:
            counts, fallbacks = await self.keys.key_status(ctx.user_id, ctx.device_id)
        ctx.body["device_lists"] = {"changed": sorted(changed), "left": sorted(left)}
        ctx.body["device_one_time_keys_count"] = counts
        ctx.body["device_unused_fallback_key_types"] = fallbacks
        if changed or left:
            ctx.has_news = True
        return upto
