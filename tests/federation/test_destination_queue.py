"""The per-destination state machine (roomstream.federation.destination_queue), without I/O.

A property test drives it with random events, EDUs, failures, ticks and REMOTE_SERVER_UP,
plays the database's part (``destination_rooms``: each room's newest event for the
destination) and checks it against a naive model: nothing delivered twice, deliveries in
stream order, every room's newest event delivered once the destination is up, and with no
failure at all every event delivered in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given
from hypothesis import strategies as st

from roomstream.federation.destination_queue import (
    MAX_EDUS_PER_TRANSACTION,
    MAX_PDUS_PER_TRANSACTION,
    BackoffPolicy,
    DestinationQueue,
    Edu,
    LoadCatchUp,
    PlannedTransaction,
    QueuedPdu,
    Wait,
)

POLICY = BackoffPolicy(min_interval_ms=1000, multiplier=2.0, max_interval_ms=60_000)


def pdu(so: int, room: str = "!a:x") -> QueuedPdu:
    return QueuedPdu(f"$e{so}", room, so, {"n": so})


@dataclass
class Harness:
    """The sender's side: the database rows, the clock, what the remote received."""

    queue: DestinationQueue = field(default_factory=lambda: DestinationQueue("remote", POLICY))
    now: int = 1_000_000
    next_so: int = 1
    rooms: dict[str, QueuedPdu] = field(default_factory=dict)
    events: list[QueuedPdu] = field(default_factory=list)
    delivered: list[QueuedPdu] = field(default_factory=list)
    edus_delivered: list[Edu] = field(default_factory=list)
    failures: int = 0

    def event(self, room: str) -> None:
        p = pdu(self.next_so, room)
        self.next_so += 1
        self.rooms[room] = p  # destination_rooms is written before the queue hears of it
        self.events.append(p)
        self.queue.add_pdu(p)

    def step(self) -> PlannedTransaction | Wait:
        while True:
            step = self.queue.next_step(self.now)
            if not isinstance(step, LoadCatchUp):
                return step
            after = -1 if step.after is None else step.after
            rows = sorted(
                (p for p in self.rooms.values() if p.stream_ordering > after),
                key=lambda p: p.stream_ordering,
            )
            self.queue.catch_up_loaded(rows[: step.limit])

    def attempt(self, succeed: bool, step: PlannedTransaction | Wait | None = None) -> None:
        step = self.step() if step is None else step
        if not isinstance(step, PlannedTransaction):
            return
        assert len(step.pdus) <= MAX_PDUS_PER_TRANSACTION
        assert len(step.edus) <= MAX_EDUS_PER_TRANSACTION
        # One transaction in flight: asking again plans nothing.
        assert self.queue.next_step(self.now) == Wait(None)
        if succeed:
            self.delivered.extend(step.pdus)
            self.edus_delivered.extend(step.edus)
            self.queue.on_success(self.now)
        else:
            self.failures += 1
            self.queue.on_failure(self.now, 1.0)

    def drain(self) -> None:
        for _ in range(10_000):
            self.now += 10**9
            step = self.step()
            if isinstance(step, Wait) and step.until is None:
                return
            self.attempt(True, step)
        raise AssertionError("the queue never drained")


operations = st.lists(
    st.one_of(
        st.tuples(st.just("event"), st.sampled_from(["!a:x", "!b:x", "!c:x"])),
        st.tuples(st.just("attempt"), st.booleans()),
        st.tuples(st.just("tick"), st.integers(0, 5000)),
        st.tuples(st.just("edu"), st.sampled_from(["@u:x", "@v:x"])),
        st.just(("up", None)),
    ),
    max_size=120,
)


@given(operations)
def test_queue_against_naive_model(ops: list[tuple[str, object]]) -> None:
    h = Harness()
    last_edu: dict[str, Edu] = {}
    for name, arg in ops:
        if name == "event":
            h.event(str(arg))
        elif name == "attempt":
            h.attempt(bool(arg))
        elif name == "tick":
            h.now += int(str(arg))
        elif name == "edu":
            edu = Edu("m.typing", {"user_id": arg}, key=("typing", str(arg)))
            last_edu[str(arg)] = edu
            h.queue.add_edu(edu)
        else:
            h.queue.reset_backoff()
    h.drain()
    ids = [p.event_id for p in h.delivered]
    assert len(ids) == len(set(ids)), "a PDU was delivered twice"
    orderings = [p.stream_ordering for p in h.delivered]
    assert orderings == sorted(orderings), "PDUs out of stream order"
    delivered = set(ids)
    for room, newest in h.rooms.items():
        assert newest.event_id in delivered, f"{room}'s newest event never reached the remote"
    if h.failures == 0:
        assert h.delivered == h.events
    assert not h.queue.catching_up and h.queue.pending_edu_count == 0
    # Keyed EDUs: the newest of each key always arrives (older ones may be replaced).
    for user, edu in last_edu.items():
        assert any(d is edu for d in h.edus_delivered), f"{user}'s newest EDU was lost"


def test_backoff_doubles_from_the_minimum_and_is_capped() -> None:
    q = DestinationQueue("remote", POLICY)
    q.add_pdu(pdu(1))
    now = 0
    intervals = []
    for _ in range(8):
        step = q.next_step(now)
        assert isinstance(step, PlannedTransaction | LoadCatchUp)
        if isinstance(step, LoadCatchUp):
            q.catch_up_loaded([pdu(1)])
            step = q.next_step(now)
        assert isinstance(step, PlannedTransaction)
        retry = q.on_failure(now, 1.0)
        intervals.append(retry.retry_interval)
        assert q.next_step(now + retry.retry_interval - 1) == Wait(now + retry.retry_interval)
        now += retry.retry_interval
    assert intervals == [1000, 2000, 4000, 8000, 16000, 32000, 60000, 60000]
    assert isinstance(q.next_step(now), LoadCatchUp)


def test_reset_backoff_allows_an_immediate_retry() -> None:
    q = DestinationQueue("remote", POLICY)
    q.add_pdu(pdu(1))
    assert isinstance(q.next_step(0), PlannedTransaction)
    q.on_failure(0)
    assert q.next_step(1) == Wait(1000)
    q.reset_backoff()
    assert isinstance(q.next_step(1), LoadCatchUp)


def test_catch_up_sends_the_newest_event_of_each_room_then_goes_live() -> None:
    q = DestinationQueue("remote", POLICY)
    q.add_pdu(pdu(1, "!a:x"))
    assert isinstance(q.next_step(0), PlannedTransaction)
    q.on_success(0)
    assert q.last_successful_stream_ordering == 1
    q.add_pdu(pdu(2, "!a:x"))
    assert isinstance(q.next_step(0), PlannedTransaction)
    q.on_failure(0)
    for so, room in [(3, "!b:x"), (4, "!a:x"), (5, "!b:x")]:
        q.add_pdu(pdu(so, room))  # skipped: catching up
    assert q.pending_pdu_count == 0
    step = q.next_step(5000)
    assert step == LoadCatchUp(1)
    q.catch_up_loaded([pdu(4, "!a:x"), pdu(5, "!b:x")])
    planned = q.next_step(5000)
    assert isinstance(planned, PlannedTransaction) and planned.catch_up
    assert [p.stream_ordering for p in planned.pdus] == [4, 5]
    assert q.on_success(5000) is True  # it was failing: up again
    assert q.next_step(5000) == LoadCatchUp(5)
    q.catch_up_loaded([])
    assert not q.catching_up
    q.add_pdu(pdu(6))
    planned = q.next_step(5000)
    assert isinstance(planned, PlannedTransaction) and not planned.catch_up
    assert [p.stream_ordering for p in planned.pdus] == [6]


def test_a_pdu_skipped_during_the_load_makes_it_load_again() -> None:
    q = DestinationQueue("remote", POLICY, last_successful_stream_ordering=3, catching_up=True)
    assert q.next_step(0) == LoadCatchUp(3)
    q.add_pdu(pdu(4))  # stored after the load's snapshot
    q.catch_up_loaded([])
    assert q.catching_up
    assert q.next_step(0) == LoadCatchUp(3)
    q.catch_up_loaded([])
    assert not q.catching_up


def test_batches_respect_the_transaction_limits() -> None:
    q = DestinationQueue("remote", POLICY)
    for so in range(1, 121):
        q.add_pdu(pdu(so))
    for i in range(150):
        q.add_edu(Edu("m.presence", {"i": i}))
    sizes = []
    while True:
        step = q.next_step(0)
        if not isinstance(step, PlannedTransaction):
            break
        sizes.append((len(step.pdus), len(step.edus)))
        q.on_success(0)
    assert sizes == [(50, 100), (50, 50), (20, 0)]


def test_volatile_edus_dropped_after_a_long_backoff_durable_kept() -> None:
    policy = BackoffPolicy(min_interval_ms=2 * 60 * 60 * 1000)
    q = DestinationQueue("remote", policy)
    q.add_edu(Edu("m.typing", {}, key=("t",)))
    q.add_edu(Edu("m.direct_to_device", {"message_id": "m"}, durable=True))
    assert isinstance(q.next_step(0), PlannedTransaction)
    q.on_failure(0)
    assert q.pending_edu_count == 1


def test_a_replaced_edu_survives_the_success_of_the_older_one() -> None:
    q = DestinationQueue("remote", POLICY)
    q.add_edu(Edu("m.typing", {"typing": True}, key=("t",)))
    planned = q.next_step(0)
    assert isinstance(planned, PlannedTransaction)
    newer = Edu("m.typing", {"typing": False}, key=("t",))
    q.add_edu(newer)
    q.on_success(0)
    planned = q.next_step(0)
    assert isinstance(planned, PlannedTransaction) and planned.edus == (newer,)
