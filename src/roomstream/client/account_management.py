"""Account deactivation across accounts and rooms (``POST /account/deactivate``).

:meth:`roomstream.accounts.Accounts.deactivate` ends the account (flag, password,
tokens, devices and their keys); leaving the rooms needs the room service, so the two
are composed here.

Invariant: a deactivated user is left in no room it was joined to, invited to or
knocking on when its deactivation was asked for. The rooms are left before the account
is marked (so a failure there, say a room's writer unreachable, leaves an account that
can retry), and once more after it (a room joined in between); a room that cannot be
left in that second pass is logged, the account being deactivated by then.
"""

from __future__ import annotations

import logging

from roomstream.accounts import Accounts, Requester
from roomstream.client.rooms import RoomService
from roomstream.errors import ForbiddenError, MatrixError

__all__ = ["AccountManagement"]

logger = logging.getLogger(__name__)

#: Memberships a deactivated user must not keep (leaving rejects an invite, withdraws a
#: knock).
_LEFT_ON_DEACTIVATION = ("join", "invite", "knock")


class AccountManagement:
    def __init__(self, accounts: Accounts, rooms: RoomService) -> None:
        self.accounts = accounts
        self.rooms = rooms

    async def deactivate(self, requester: Requester) -> None:
        """Leave every room (membership ``leave`` events), then deactivate the account
        (see the module docstring for the order)."""
        await self._leave_all(requester, strict=True)
        await self.accounts.deactivate(requester.user_id)
        await self._leave_all(requester, strict=False)

    async def _leave_all(self, requester: Requester, *, strict: bool) -> None:
        for membership in _LEFT_ON_DEACTIVATION:
            for room_id in await self.rooms.events.get_rooms_for_user(
                requester.user_id, membership
            ):
                try:
                    await self.rooms.leave(requester, room_id)
                except ForbiddenError:
                    pass  # left (or was kicked) meanwhile: nothing to leave
                except MatrixError:
                    if strict:
                        raise
                    logger.warning(
                        "deactivated %s could not leave %s",
                        requester.user_id,
                        room_id,
                        exc_info=True,
                    )
