"""The homeserver process, assembled in one place.

Everything a roomstream process runs is put together here, from the bottom up: the room
engine with the participants that record in its transactions (the read side's visibility
records), the background work started for it (rebuilding visibility records an upgrade
left pending), and above it replication, the internal API and the Client-Server API.
Lower layers receive what they need through their constructors; none of them reaches up.
"""

from __future__ import annotations

import asyncio
import logging

from roomstream.config import Config
from roomstream.reading import read_side_participants
from roomstream.reading.backfill import run_pending_in_background
from roomstream.rooms.engine import RoomEngine

__all__ = ["open_room_engine"]

logger = logging.getLogger(__name__)


def _log_rebuild_failure(task: asyncio.Task[object]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error(
            "rebuilding visibility records failed (run `roomstream rebuild-visibility`)",
            exc_info=task.exception(),
        )


async def open_room_engine(config: Config) -> RoomEngine:
    """The configured room engine, wired to the read side.

    Events it persists get their visibility records in the same transaction, and rooms
    persisted before those records existed are rebuilt in the background, in bounded
    transactions, while the process serves (``engine.background``; cancelled by
    ``engine.close()``, and carried on at the next start).
    """
    engine = await RoomEngine.open(config, participants=read_side_participants())
    try:
        rebuild = await run_pending_in_background(engine.db)
    except BaseException:
        await engine.close()
        raise
    if rebuild is not None:
        rebuild.add_done_callback(_log_rebuild_failure)
        engine.background.append(rebuild)
    return engine
