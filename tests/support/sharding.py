"""Rooms on chosen ``events`` writers, so no test depends on where a random room ID hashes.

A room's owner is ``writer_for_room(room_id, writers)``: a hash, so for a random room ID it
is a coin toss (six random rooms all land on one of two writers once in 32 runs). Tests
that need rooms on particular writers either name the rooms themselves
(:func:`room_ids_for_writer`, deterministic) or, when the server makes the ID (room v12
derives it from the create event), keep creating rooms until every writer has enough
(:func:`rooms_by_owner`).
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Sequence

from roomstream.replication.sharding import writer_for_room

__all__ = ["room_ids_for_writer", "rooms_by_owner"]


def room_ids_for_writer(
    writer: str, writers: Sequence[str], server_name: str, count: int = 1, prefix: str = "room"
) -> list[str]:
    """The first ``count`` IDs ``!{prefix}{i}:{server_name}`` (i = 0, 1, ...) that
    ``writer`` owns among ``writers``: the same answer on every run."""
    if writer not in writers:
        raise ValueError(f"{writer} is not among {list(writers)}")
    candidates = (f"!{prefix}{i}:{server_name}" for i in itertools.count())
    owned = (r for r in candidates if writer_for_room(r, writers) == writer)
    return list(itertools.islice(owned, count))


async def rooms_by_owner(
    create: Callable[[int], Awaitable[str]],
    writers: Sequence[str],
    per_writer: int,
    *,
    max_rooms: int = 200,
) -> dict[str, list[str]]:
    """Call ``create(i)`` (which makes a room and returns its ID) until every writer owns
    ``per_writer`` of the rooms made; returns those rooms by owner, in creation order.

    Extra rooms are left unused. Failing for want of ``max_rooms`` is, with two writers
    and 4 rooms each, less likely than 2**-170: not a flake to budget for."""
    owned: dict[str, list[str]] = {w: [] for w in writers}
    for i in range(max_rooms):
        room = await create(i)
        rooms = owned[writer_for_room(room, writers)]
        if len(rooms) < per_writer:
            rooms.append(room)
        if all(len(r) == per_writer for r in owned.values()):
            return owned
    raise AssertionError(f"{max_rooms} rooms did not give {per_writer} to each of {writers}")
