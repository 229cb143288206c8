"""Older history of a room from other homeservers (backfill on demand), as an interface.

The client layer never imports :mod:`roomstream.federation`: the process assembly gives
the ``/messages`` route an implementation
(``roomstream.federation.backfill.FederationBackfill``), or none on a server without
federation, where a page ends where this server's history of the room ends.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

__all__ = ["BACKFILL_EXTRA", "BACKFILL_TIMEOUT", "RemoteHistory", "fetch_older_history"]

logger = logging.getLogger(__name__)

#: Asked for beyond the page's size: events the user may not see, state events.
BACKFILL_EXTRA = 10
#: The most a ``/messages`` page waits for other servers (the implementation keeps its
#: own, shorter budget; this bounds it whatever it does).
BACKFILL_TIMEOUT = 30.0


class RemoteHistory(Protocol):
    async def backfill(self, room_id: str, limit: int) -> int:
        """Fetch up to ``limit`` events of the room older than what this server holds
        from another server in it and store them (as backfilled events, through the
        receive path); the number newly stored. Makes no request when this server holds
        the room's history down to its start."""
        ...


async def fetch_older_history(
    history: RemoteHistory,
    room_id: str,
    page_limit: int,
    *,
    timeout: float = BACKFILL_TIMEOUT,  # noqa: ASYNC109 (a bound, not a scheduling aid)
) -> bool:
    """Whether backfill stored anything for a backwards page of ``page_limit`` events
    that came back short. Never raises for another server's failure and never waits
    past ``timeout``: the page is then served from what is stored."""
    try:
        async with asyncio.timeout(timeout):
            return await history.backfill(room_id, page_limit + BACKFILL_EXTRA) > 0
    # Other servers' failures must not fail the client's read (see the module).
    except Exception as exc:
        logger.info("backfill of %s failed: %s", room_id, exc)
        return False
