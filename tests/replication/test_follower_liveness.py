"""When a follower session is *live* for a ``(stream, writer)``: the one definition the
transports and the token cache rely on (``FollowerSession.is_live``). Live means the
writer has positioned this session, everything it announced is processed (no gap being
fetched, no batch half received), and the connection has not been lost."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from roomstream.replication.commands import Command
from roomstream.replication.follower import StreamFollower
from tests.support.follower import follower, position, rdata


def test_live_only_once_positioned_and_caught_up_and_while_open() -> None:
    f, _ = follower({("events", "w1"): 5})
    session = f.new_session()
    assert not session.is_live("events", "w1")  # nothing positioned yet
    gap = session.handle(position(8, 8))  # the writer is at 8; 6..8 were missed
    assert gap is not None
    assert not session.is_live("events", "w1")  # the gap is being fetched
    session.apply_updates(gap, [(6, "a"), (8, "b")])
    session.advance_to(gap, gap.upto_token)
    assert session.is_live("events", "w1")
    assert not session.is_live("events", "w2")  # another writer: never positioned here
    session.handle(rdata(None, "c1"))  # a batch: its token's rows are still arriving
    assert not session.is_live("events", "w1")
    session.handle(rdata(9, "c2"))
    assert session.is_live("events", "w1")
    session.closed = True  # the transport lost the connection
    assert not session.is_live("events", "w1")
    fresh = f.new_session()  # a new connection: live again only after its POSITION
    assert not fresh.is_live("events", "w1")
    assert fresh.handle(position(9, 9)) is None
    assert fresh.is_live("events", "w1")


def _command(kind: str, token: int) -> Command:
    if kind == "batch":
        return rdata(None, "row")
    if kind == "row":
        return rdata(token, "row")
    return position(0, token)  # the writer wrote nothing the reader lacks


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["row", "batch", "position", "gap"]), st.integers(1, 4)),
        max_size=30,
    )
)
def test_live_matches_a_naive_reading_of_the_definition(steps: list[tuple[str, int]]) -> None:
    """Against a model: positioned on this session, no batch open, processed token at the
    highest token announced. Gaps are filled at once (fetches always succeed here)."""
    f: StreamFollower
    f, _ = follower({("events", "w1"): 0})
    session = f.new_session()
    positioned, batch_open, announced, processed = False, False, 0, 0
    token = 0
    for kind, step in steps:
        token += step
        if kind == "gap":
            gap = session.handle(position(token, token))
            if gap is not None:
                assert not session.is_live("events", "w1")  # announced, not processed
                updates: list[tuple[int, Any]] = [(gap.upto_token, "fetched")]
                session.apply_updates(gap, updates)
                session.advance_to(gap, gap.upto_token)
            positioned, batch_open = True, False
            announced = max(announced, token)
            processed = max(processed, token)
        else:
            session.handle(_command(kind, token))
            if kind == "position":
                positioned, batch_open = True, False
                announced, processed = max(announced, token), max(processed, token)
            elif positioned and kind == "batch":
                batch_open = True
            elif positioned and kind == "row":
                batch_open = False
                announced, processed = max(announced, token), max(processed, token)
        expected = positioned and not batch_open and processed >= announced
        assert session.is_live("events", "w1") == expected, (kind, token)
    assert f.is_caught_up("events", "w1") == (processed >= announced)
