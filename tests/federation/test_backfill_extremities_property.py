"""``backward_extremities_txn`` against a naive oracle (hypothesis), on both engines:
random DAG fragments of timeline, outlier, rejected and absent events (the create event
among them or not), with the scan and the limit small enough to bind."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roomstream.events.types import EventTypes
from roomstream.federation.backfill import backward_extremities_txn
from roomstream.storage import DatabaseConfig, Transaction, connect, prepare_database

STATUSES = ("timeline", "outlier", "rejected", "absent")
_rooms = itertools.count()


@dataclass(frozen=True)
class Node:
    status: str
    depth: int
    prevs: tuple[int, ...]


@st.composite
def fragments(draw: st.DrawFn) -> list[Node]:
    size = draw(st.integers(1, 12))
    return [
        Node(
            draw(st.sampled_from(STATUSES)),
            draw(st.integers(0, 6)),
            tuple(sorted(draw(st.sets(st.integers(0, size - 1), max_size=3)))),
        )
        for _ in range(size)
    ]


def _id(room: str, i: int) -> str:
    return f"${room}-{i}"


def oracle(room: str, nodes: list[Node], scan: int, limit: int) -> list[str]:
    """Straight from the definition: prev events of the ``scan`` lowest timeline events
    that are absent, or outliers other than the create event (node 0 is the create)."""
    stored = [(n.depth, i) for i, n in enumerate(nodes) if n.status == "timeline"]
    lowest = sorted(stored)[:scan]  # (the stream ordering of node i grows with i)
    found: dict[int, int] = {}
    for depth, i in lowest:
        for p in nodes[i].prevs:
            status = nodes[p].status
            if status == "absent" or (status == "outlier" and p != 0):
                found[p] = min(found.get(p, depth), depth)
    ordered = sorted(found, key=lambda p: (found[p], _id(room, p)))
    return [_id(room, p) for p in ordered[:limit]]


def _insert_txn(txn: Transaction, room: str, nodes: list[Node]) -> None:
    row = txn.query_one("SELECT COALESCE(MAX(stream_ordering), 0) FROM events")
    base = int(row[0]) + 1
    for i, node in enumerate(nodes):
        if node.status == "absent":
            continue
        txn.execute(
            "INSERT INTO events (stream_ordering, topological_ordering, event_id, room_id,"
            " type, sender, outlier, rejected_reason, origin_server_ts, received_ts,"
            " instance_name) VALUES (?, ?, ?, ?, ?, '@a:x', ?, ?, 0, 0, 'main')",
            (
                base + i,
                node.depth,
                _id(room, i),
                room,
                EventTypes.CREATE if i == 0 else "m.room.message",
                node.status == "outlier",
                "denied" if node.status == "rejected" else None,
            ),
        )
        for p in node.prevs:
            txn.execute(
                "INSERT INTO event_edges (event_id, prev_event_id) VALUES (?, ?)",
                (_id(room, i), _id(room, p)),
            )


async def _check(db_config: DatabaseConfig, nodes: list[Node], scan: int, limit: int) -> None:
    database = connect(db_config)
    try:
        await prepare_database(database)
        room = f"!r{next(_rooms)}:x"
        await database.run_interaction("test_insert", _insert_txn, room, nodes)
        got = await database.run_interaction(
            "test_extremities", backward_extremities_txn, room, limit, scan
        )
        assert got == oracle(room, nodes, scan, limit)
    finally:
        await database.close()


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(nodes=fragments(), scan=st.integers(1, 12), limit=st.integers(1, 5))
def test_backward_extremities_match_the_oracle(
    db_config: DatabaseConfig, nodes: list[Node], scan: int, limit: int
) -> None:
    asyncio.run(_check(db_config, nodes, scan, limit))
