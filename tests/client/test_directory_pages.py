"""The public room list's tokens against a naive oracle: walking ``next_batch`` forwards
and ``prev_batch`` back visits every published room the views know exactly once, in the
list order (most joined members first, then room ID), on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roomstream.client.directory import DirectoryReader
from roomstream.storage import DatabaseConfig, Transaction, connect, prepare_database

#: (room ID suffix, joined members, published, known to the views)
rooms = st.lists(
    st.tuples(
        st.text("abc", min_size=1, max_size=3),  # one case: any collation agrees
        st.integers(0, 3),
        st.booleans(),
        st.booleans(),
    ),
    max_size=12,
    unique_by=lambda r: r[0],
)


def _fill(txn: Transaction, spec: list[tuple[str, int, bool, bool]]) -> None:
    for table in ("view_room_stats", "view_room_state", "rooms"):
        txn.execute(f"DELETE FROM {table}")
    for suffix, joined, published, in_views in spec:
        room_id = f"!{suffix}"
        txn.execute(
            "INSERT INTO rooms (room_id, room_version, creator, is_public) VALUES (?, ?, ?, ?)",
            (room_id, "12", "@c:t", published),
        )
        if in_views:
            txn.execute(
                "INSERT INTO view_room_stats (room_id, joined_members) VALUES (?, ?)",
                (room_id, joined),
            )


async def _walk(
    config: DatabaseConfig, spec: list[tuple[str, int, bool, bool]], limit: int
) -> None:
    db = connect(config)
    try:
        await prepare_database(db)
        await db.run_interaction("fill", _fill, spec)
        reader = DirectoryReader(db)
        listed = [(-j, f"!{s}") for s, j, published, in_views in spec if published and in_views]
        oracle = [room for _, room in sorted(listed)]
        forward: list[str] = []
        pages = []
        token = None
        while True:
            page = await reader.public_rooms(limit, token, None)
            assert page.total_room_count_estimate == len(oracle)
            assert len(page.chunk) <= limit
            assert (page.prev_batch is not None) == (token is not None and bool(page.chunk))
            forward += [r.room_id for r in page.chunk]
            pages.append([r.room_id for r in page.chunk])
            if page.next_batch is None:
                break
            assert len(page.chunk) == limit
            token = page.next_batch
        assert forward == oracle
        # Back from the last page: the same pages, in reverse.
        token = page.prev_batch
        for expected in reversed(pages[:-1]):
            assert token is not None
            back = await reader.public_rooms(limit, token, None)
            assert [r.room_id for r in back.chunk] == expected
            token = back.prev_batch
        assert token is None
    finally:
        await db.close()


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(spec=rooms, limit=st.integers(1, 4))
def test_room_list_tokens_match_the_oracle(
    db_config: DatabaseConfig, spec: list[tuple[str, int, bool, bool]], limit: int
) -> None:
    asyncio.run(_walk(db_config, spec, limit))
