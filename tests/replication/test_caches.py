"""The cache layer: LRU behaviour, row application (key, whole cache, group), sharding."""

from __future__ import annotations

import pytest

from roomstream.caches import STATE_CACHE_GROUP, CacheGroup, CacheRegistry
from roomstream.replication.sharding import shard_for, writer_for_room


def test_rows_invalidate_key_whole_cache_and_unknown_names() -> None:
    registry = CacheRegistry()
    users = registry.register("get_user")
    users.set(("@a:x",), 1)
    users.set(("@b:x",), 2)
    registry.apply_row(["get_user", ["@a:x"], 1])
    assert ("@a:x",) not in users and ("@b:x",) in users
    registry.apply_row(["unknown_cache", ["@b:x"], 2])  # nothing cached under it here
    assert ("@b:x",) in users
    registry.apply_row(["get_user", None, 3])
    assert len(users) == 0
    # JSON lists inside keys become tuples, so they match tuple keys.
    pairs = registry.register("pairs")
    pairs.set((("a", 1), "z"), 1)
    registry.apply_row(["pairs", [["a", 1], "z"], 4])
    assert len(pairs) == 0
    assert registry.rows_applied == 4


def test_group_row_invalidates_several_caches() -> None:
    registry = CacheRegistry()
    registry.define_group(
        CacheGroup(
            STATE_CACHE_GROUP,
            by_first=("get_current_state", "get_users_in_room"),
            by_each_rest=("get_rooms_for_user",),
            whole=("get_room_summary_any",),
        )
    )
    state = registry.register("get_current_state")
    members = registry.register("get_users_in_room")
    rooms_for = registry.register("get_rooms_for_user")
    summary = registry.register("get_room_summary_any")
    other = registry.register("unrelated")
    for room in ("!r", "!s"):
        state.set((room, "m.room.name", ""), "x")
        members.set((room,), ["@a", "@b"])
    for user in ("@a", "@b", "@c"):
        rooms_for.set((user,), ["!r"])
    summary.set(("!s",), 1)
    other.set(("!r",), 1)
    registry.apply_row([STATE_CACHE_GROUP, ["!r", "@a", "@b"], 5])
    assert state.keys() == [("!s", "m.room.name", "")]
    assert members.keys() == [("!s",)]
    assert rooms_for.keys() == [("@c",)]
    assert len(summary) == 0
    assert ("!r",) in other
    registry.apply_row([STATE_CACHE_GROUP, None, 6])
    assert len(state) == len(members) == len(rooms_for) == 0 and len(other) == 1
    with pytest.raises(ValueError):
        registry.register(STATE_CACHE_GROUP)


def test_sharding_is_stable_and_spreads_rooms() -> None:
    writers = ["w1", "w2", "w3"]
    rooms = [f"!room{i}:hs" for i in range(300)]
    owners = [writer_for_room(r, writers) for r in rooms]
    # Same answer every time and in every process (SHA-256, not the salted hash()).
    assert owners == [writer_for_room(r, writers) for r in rooms]
    assert (
        shard_for("!room0:hs", 3)
        == int.from_bytes(__import__("hashlib").sha256(b"!room0:hs").digest()[:8], "big") % 3
    )
    counts = {w: owners.count(w) for w in writers}
    assert all(60 < n < 140 for n in counts.values()), counts
    assert writer_for_room("!a:hs", ["only"]) == "only"
    with pytest.raises(ValueError):
        writer_for_room("!a:hs", [])
