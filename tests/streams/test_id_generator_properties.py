"""Property test: random interleavings of reserve / commit / rollback / advance / restart
over 1-4 writers (plus a reader) against a small reference model.

Checked after every step, for every process's view:

- positions (per writer and linear) never decrease, including across restarts;
- no position reaches an ID still in flight: a writer's position is below its lowest
  in-flight ID, the linear position below the lowest in flight anywhere;
- each writer's own position, and what each process knows of the others, equal the model.

At the end everything is completed and every position exchanged: every view's linear
position must reach the highest allocated ID, and reading each writer's rows up to it
returns exactly the facts it committed (nothing skipped, nothing twice).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import uuid
from dataclasses import dataclass, field

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roomstream.storage import Database, DatabaseConfig, connect, prepare_database
from roomstream.streams import StreamIdGenerator
from roomstream.streams.registry import CACHES, get_updates_txn
from tests.support.streams import OpenReservation, caches_generator

READER = "reader"

Op = tuple[str, int, int]

ops_strategy = st.lists(
    st.one_of(
        st.tuples(st.just("reserve"), st.integers(0, 3), st.integers(1, 3)),
        st.tuples(st.just("commit"), st.integers(0, 3), st.integers(0, 5)),
        st.tuples(st.just("rollback"), st.integers(0, 3), st.integers(0, 5)),
        # advance: process `a` learns the stored position of writer `b`.
        st.tuples(st.just("advance"), st.integers(0, 4), st.integers(0, 3)),
        st.tuples(st.just("restart"), st.integers(0, 4), st.just(0)),
        # store: writer `a` stores (and would announce) its current position.
        st.tuples(st.just("store"), st.integers(0, 3), st.just(0)),
    ),
    max_size=40,
)


@dataclass
class ModelView:
    """What one process should know: its own in-flight IDs and max-seen, others' positions."""

    max_seen: int
    known: dict[str, int]
    open: list[OpenReservation] = field(default_factory=list)


class Harness:
    def __init__(self, database: Database, writers: list[str]) -> None:
        self.db = database
        self.writers = writers
        self.gens: dict[str, StreamIdGenerator] = {}
        self.views: dict[str, ModelView] = {}
        self.last_positions: dict[str, dict[str, int]] = {}
        self.last_linear: dict[str, int] = {}
        self.committed: dict[str, set[int]] = {w: set() for w in writers}
        self.allocated = 0

    @property
    def processes(self) -> list[str]:
        return [*self.writers, READER]

    def in_flight(self, writer: str) -> list[int]:
        view = self.views.get(writer)
        return [i for r in view.open for i in r.ids] if view else []

    async def start(self, name: str) -> None:
        old = self.views.get(name)
        gen = await caches_generator(self.db, name, self.writers)
        self.gens[name] = gen
        stored = await self.db.run_interaction(
            "test_query",
            lambda t: dict(
                t.query(
                    "SELECT instance_name, stream_id FROM stream_positions"
                    " WHERE stream_name = 'caches'"
                )
            ),
        )
        # Model: a restarted process knows what is stored; its own position is the
        # sequence value (everything it held died with the old process).
        known = {w: stored.get(w, self.allocated) for w in self.writers if w != name}
        self.views[name] = ModelView(max_seen=self.allocated, known=known)
        if old is not None:
            old.open.clear()  # abandoned: their transactions died

    def expected_position(self, name: str, writer: str) -> int:
        view = self.views[name]
        if writer != name:
            return view.known[writer]
        flight = self.in_flight(name)
        return min(flight) - 1 if flight else view.max_seen

    def check(self) -> None:
        lowest_anywhere = min((i for w in self.writers for i in self.in_flight(w)), default=None)
        for name in self.processes:
            gen = self.gens[name]
            positions = gen.get_positions()
            assert list(positions) == sorted(self.writers)
            for writer, position in positions.items():
                assert position == self.expected_position(name, writer), (name, writer)
                assert position >= self.last_positions.get(name, {}).get(writer, 0), (
                    f"{name}'s position of {writer} went backwards"
                )
                flight = self.in_flight(writer)
                if flight:
                    assert position < min(flight), f"{name} passed {writer}'s in-flight ID"
            linear = gen.get_linear_position()
            assert linear >= self.last_linear.get(name, 0), f"{name}'s linear went backwards"
            assert linear == min(positions.values())
            if lowest_anywhere is not None:
                assert linear < lowest_anywhere, f"{name}'s linear passed an in-flight ID"
            self.last_positions[name] = positions
            self.last_linear[name] = linear

    async def apply(self, op: Op) -> None:
        kind, a, b = op
        if kind == "reserve":
            writer = self.writers[a % len(self.writers)]
            r = await OpenReservation.open(self.gens[writer], b)
            self.allocated = max(self.allocated, *r.ids)
            view = self.views[writer]
            view.max_seen = max(view.max_seen, *r.ids)
            view.open.append(r)
        elif kind in ("commit", "rollback"):
            writer = self.writers[a % len(self.writers)]
            view = self.views[writer]
            if not view.open:
                return
            r = view.open.pop(b % len(view.open))
            if kind == "commit":
                await r.commit(self.db, writer)
                self.committed[writer].update(r.ids)
            else:
                await r.rollback()
        elif kind == "advance":
            name = self.processes[a % len(self.processes)]
            writer = self.writers[b % len(self.writers)]
            announced = self.gens[writer].get_stored_position()
            self.gens[name].advance(writer, announced)
            view = self.views[name]
            view.max_seen = max(view.max_seen, announced)
            if writer != name:
                view.known[writer] = max(view.known[writer], announced)
        elif kind == "restart":
            await self.start(self.processes[a % len(self.processes)])
        elif kind == "store":
            await self.gens[self.writers[a % len(self.writers)]].store_local_position()

    async def quiesce(self) -> None:
        for writer in self.writers:
            for r in list(self.views[writer].open):
                await r.commit(self.db, writer)
                self.committed[writer].update(r.ids)
            self.views[writer].open.clear()
        for _ in range(2):
            for name in self.processes:
                for writer in self.writers:
                    self.gens[name].advance(writer, self.gens[writer].get_stored_position())
            for writer in self.writers:
                await self.gens[writer].store_local_position()
        sequence_value = await self.db.run_interaction(
            "test_query", lambda t: t.sequence_value(CACHES.sequence)
        )
        for name in self.processes:
            assert self.gens[name].get_linear_position() == sequence_value, name
        for writer in self.writers:
            updates, upto, limited = await self.db.run_interaction(
                "get_updates", get_updates_txn, CACHES, writer, 0, sequence_value, 10_000
            )
            assert not limited and upto == sequence_value
            ids = [token for token, _ in updates]
            assert ids == sorted(self.committed[writer]), writer


async def run_scenario(config: DatabaseConfig, writer_count: int, ops: list[Op]) -> None:
    db = connect(config)
    try:
        await prepare_database(db)
        harness = Harness(db, [f"w{i}" for i in range(writer_count)])
        for name in harness.processes:
            await harness.start(name)
        harness.check()
        for op in ops:
            await harness.apply(op)
            harness.check()
        await harness.quiesce()
    finally:
        await db.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(writer_count=st.integers(1, 4), ops=ops_strategy)
def test_positions_against_model_sqlite(writer_count: int, ops: list[Op]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        config = DatabaseConfig(engine="sqlite", path=os.path.join(tmp, "p.db"))
        asyncio.run(run_scenario(config, writer_count, ops))


@pytest.fixture(scope="module")
def pg_dsn_for_properties(pg_database: str) -> str:
    return pg_database


def test_positions_against_model_postgres(pg_dsn_for_properties: str) -> None:
    dsn = pg_dsn_for_properties

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(writer_count=st.integers(1, 4), ops=ops_strategy)
    def inner(writer_count: int, ops: list[Op]) -> None:
        schema = f"p_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        try:
            config = DatabaseConfig(engine="postgres", dsn=dsn, schema=schema, pool_min=1)
            asyncio.run(run_scenario(config, writer_count, ops))
        finally:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA {schema} CASCADE")

    inner()
