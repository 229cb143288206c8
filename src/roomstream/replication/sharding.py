"""Which ``events`` writer owns a room: a stable hash of the room ID over the writers.

Every process computes the same owner from the same configuration (the hash is SHA-256,
not Python's per-process salted ``hash``), so any process can route an event to the one
writer that persists events for that room. Only the owner writes a room's events, which
keeps each room's events on one writer and its per-room locks meaningful.

Changing the list of writers moves rooms between them; do it only while no events are
being sent.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

__all__ = ["shard_for", "writer_for_room"]


def shard_for(key: str, shards: int) -> int:
    """A number in ``[0, shards)`` derived from ``key``, identical in every process."""
    if shards < 1:
        raise ValueError("shards must be at least 1")
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % shards


def writer_for_room(room_id: str, writers: Sequence[str]) -> str:
    """The writer (from the configured ``events`` writers, in configuration order) that
    owns ``room_id``."""
    if not writers:
        raise ValueError("no events writers configured")
    return writers[shard_for(room_id, len(writers))]
