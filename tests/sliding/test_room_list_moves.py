"""The wake path's in-place move of rooms in a user's room list, against sorting."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from roomstream.client.sliding_sync import _RECENCY, _moved
from roomstream.sliding.store import RoomEntry


@st.composite
def lists_and_moves(draw: st.DrawFn) -> tuple[list[RoomEntry], list[RoomEntry], list[RoomEntry]]:
    rooms = draw(st.lists(st.sampled_from("abcdefghijklmnop"), unique=True, max_size=16))
    entries = [RoomEntry(f"!{r}", "join", draw(st.integers(0, 6)), "@u", 0) for r in rooms]
    entries.sort(key=_RECENCY, reverse=True)
    chosen = draw(st.lists(st.sampled_from(entries), unique_by=id)) if entries else []
    moved = [replace(e, activity=draw(st.integers(0, 12))) for e in chosen]
    return entries, chosen, moved


@given(lists_and_moves())
def test_moving_rooms_keeps_the_order_sorting_gives(
    case: tuple[list[RoomEntry], list[RoomEntry], list[RoomEntry]],
) -> None:
    entries, before, after = case
    snapshot = list(entries)
    replaced = {b.room_id: a for b, a in zip(before, after, strict=True)}
    expected = sorted((replaced.get(e.room_id, e) for e in entries), key=_RECENCY, reverse=True)
    assert _moved(entries, before, after) == expected
    assert entries == snapshot  # the input list (shared by snapshots) is not changed
