"""The reader's sans-I/O rules, and the writer's command framing, without sockets."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from roomstream.replication.commands import (
    Command,
    PingCommand,
    PositionCommand,
    RdataCommand,
)
from roomstream.replication.follower import FollowerSession, Gap, fill_gap
from roomstream.replication.writer import updates_to_commands
from tests.support.follower import Callbacks, follower, position, rdata


def test_rdata_before_position_is_ignored() -> None:
    f, calls = follower({("events", "w1"): 5})
    session = f.new_session()
    assert session.handle(rdata(6, "a")) is None
    assert calls.processed == []
    assert f.processed("events", "w1") == 5
    assert session.handle(position(6, 6)) == Gap("events", "w1", 5, 6)
    assert session.is_positioned("events", "w1")


def test_batches_are_processed_together_once() -> None:
    f, calls = follower({("events", "w1"): 5})
    session = f.new_session()
    session.handle(position(5, 5))
    for cmd in (rdata(None, "a"), rdata(None, "b"), rdata(7, "c"), rdata(7, "c-again")):
        session.handle(cmd)
    session.handle(rdata(None, "dup1"))
    session.handle(rdata(6, "dup2"))  # at or below the processed token: dropped with batch
    session.handle(rdata(9, "d"))
    assert calls.processed == [("events", "w1", 7, ["a", "b", "c"]), ("events", "w1", 9, ["d"])]
    assert calls.moves == [("events", "w1", 7), ("events", "w1", 9)]


def test_position_without_gap_moves_without_processing() -> None:
    f, calls = follower({("events", "w1"): 5})
    session = f.new_session()
    assert session.handle(position(3, 8)) is None  # prev <= processed: nothing missed
    assert f.processed("events", "w1") == 8
    assert calls.processed == [] and calls.moves == [("events", "w1", 8)]
    assert session.handle(position(8, 8)) is None
    assert calls.moves == [("events", "w1", 8)]  # no news, no callback


def test_gap_is_filled_page_by_page_then_live_rows_continue() -> None:
    import asyncio

    history = [(6, "a"), (6, "b"), (8, "c"), (9, "d"), (12, "e")]

    async def fetch(stream: str, writer: str, frm: int, upto: int, limit: int) -> Any:
        rows = [u for u in history if frm < u[0] <= upto]
        if len(rows) <= limit:
            return rows, upto, False
        cap = rows[limit][0] - 1
        if cap <= frm:  # one token holds more than limit rows: take it whole
            cap = rows[limit][0]
        return [u for u in rows if u[0] <= cap], cap, True

    f, calls = follower({("events", "w1"): 5})
    session = f.new_session()
    gap = session.handle(position(12, 12))
    assert gap == Gap("events", "w1", 5, 12)
    asyncio.run(fill_gap(session, gap, fetch, limit=1))
    session.handle(rdata(12, "e"))  # already fetched
    session.handle(rdata(13, "f"))
    assert [(t, rows) for _, _, t, rows in calls.processed] == [
        (6, ["a", "b"]),
        (8, ["c"]),
        (9, ["d"]),
        (12, ["e"]),
        (13, ["f"]),
    ]


def test_each_session_needs_its_own_position() -> None:
    f, calls = follower({("events", "w1"): 0})
    first = f.new_session()
    first.handle(position(0, 0))
    first.handle(rdata(1, "a"))
    second = f.new_session()
    second.handle(rdata(2, "b"))  # new connection, not positioned yet
    assert [t for _, _, t, _ in calls.processed] == [1]
    first.closed = True
    first.handle(rdata(3, "c"))  # a closed session does nothing
    assert [t for _, _, t, _ in calls.processed] == [1]


def test_own_writes_unknown_streams_and_other_commands_are_ignored() -> None:
    f, calls = follower({("events", "w1"): 0})
    session = f.new_session()
    assert session.handle(position(0, 9, writer="me")) is None
    assert session.handle(position(0, 9, stream="receipts")) is None
    assert session.handle(PingCommand("1")) is None
    assert f.processed("events", "me") is None and calls.moves == []


def test_unknown_writer_starts_at_its_first_position() -> None:
    f, calls = follower()
    session = f.new_session()
    assert session.handle(position(40, 42, writer="w9")) is None
    assert f.processed("events", "w9") == 42
    session.handle(rdata(43, "x", writer="w9"))
    assert calls.processed == [("events", "w9", 43, ["x"])]


def test_in_memory_stream_new_epoch_resets() -> None:
    f, _ = follower({("typing", "w1"): 50}, in_memory=["typing"])
    session = f.new_session()
    assert session.handle(position(3, 3, stream="typing")) is None
    assert f.processed("typing", "w1") == 3 and f.resets == 1
    # A table stream never goes back.
    f2, _ = follower({("events", "w1"): 50})
    assert f2.new_session().handle(position(3, 3)) is None
    assert f2.processed("events", "w1") == 50


def test_updates_to_commands_batches_and_positions() -> None:
    updates = [(3, ("a",)), (3, ("b",)), (5, ("c",))]
    assert updates_to_commands("caches", "w1", updates, 2, 9) == [
        RdataCommand("caches", "w1", None, ("a",)),
        RdataCommand("caches", "w1", 3, ("b",)),
        RdataCommand("caches", "w1", 5, ("c",)),
        PositionCommand("caches", "w1", 5, 9),
    ]
    assert updates_to_commands("caches", "w1", updates, 2, 5)[-1] == RdataCommand(
        "caches", "w1", 5, ("c",)
    )
    assert updates_to_commands("caches", "w1", [], 4, 7) == [PositionCommand("caches", "w1", 4, 7)]


# -- property: any mix of reconnects, early live rows and stale answers ----------------


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[tuple[int, str]], list[tuple[int, int, int, int]]]:
    """A writer history and a list of connections.

    Each connection is (early, stored, last_sent, delivered): ``early`` live rows arrive
    before the REPLICATE answer ``POSITION(stored, stored)``; the connection then carries
    the writer's commands from ``last_sent`` (<= stored) on, for ``delivered`` tokens.
    """
    tokens = sorted(draw(st.sets(st.integers(1, 60), min_size=1, max_size=25)))
    history = [(t, f"r{t}.{i}") for t in tokens for i in range(draw(st.integers(1, 3)))]
    conns = []
    for _ in range(draw(st.integers(1, 5))):
        stored = draw(st.sampled_from([0, *tokens]))
        last_sent = draw(st.sampled_from([0, *[t for t in tokens if t <= stored]]))
        conns.append(
            (draw(st.integers(0, 3)), stored, last_sent, draw(st.integers(0, len(tokens))))
        )
    return history, conns


def writer_commands(history: list[tuple[int, str]], after: int) -> list[Command]:
    rows = [u for u in history if u[0] > after]
    return list(updates_to_commands("events", "w1", rows, after, rows[-1][0] if rows else after))


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_every_fact_processed_exactly_once_in_order(
    scenario: tuple[list[tuple[int, str]], list[tuple[int, int, int, int]]],
) -> None:
    import asyncio

    history, conns = scenario
    final = history[-1][0]

    async def fetch(stream: str, writer: str, frm: int, upto: int, limit: int) -> Any:
        return [u for u in history if frm < u[0] <= upto], upto, False

    async def run() -> Callbacks:
        f, calls = follower({("events", "w1"): 0})

        async def feed(session: FollowerSession, cmds: list[Command]) -> None:
            for cmd in cmds:
                gap = session.handle(cmd)
                if gap is not None:
                    await fill_gap(session, gap, fetch)

        for early, stored, last_sent, delivered in conns:
            session = f.new_session()
            live = writer_commands(history, last_sent)
            await feed(session, live[:early])
            await feed(session, [position(stored, stored)])
            tokens_seen = 0
            for cmd in live:
                if isinstance(cmd, RdataCommand) and cmd.token is not None:
                    tokens_seen += 1
                if tokens_seen > delivered:
                    break
                await feed(session, [cmd])
            session.closed = True
        last = f.new_session()
        await feed(last, [position(final, final)])
        return calls

    calls = asyncio.run(run())
    processed_tokens = [t for _, _, t, _ in calls.processed]
    assert processed_tokens == sorted(set(u[0] for u in history))
    flattened = [row for _, _, _, rows in calls.processed for row in rows]
    assert flattened == [row for _, row in history]
    advanced = [t for _, _, t in calls.moves]
    assert advanced == sorted(advanced) and advanced[-1] == final
