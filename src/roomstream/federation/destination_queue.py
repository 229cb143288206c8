"""What the federation sender sends to one destination, and when: a state machine without I/O.

One :class:`DestinationQueue` per remote server. The sender (:mod:`.sender`) feeds it PDUs
(in stream order) and EDUs, asks it for the next step with the time passed in
(:meth:`DestinationQueue.next_step`), performs the step (sends the planned transaction,
or loads catch-up PDUs from the database) and reports the outcome back. Behaviour follows
Synapse's ``PerDestinationQueue`` and ``RetryDestinationLimiter``:

- **One transaction in flight** per destination; a transaction holds at most
  :data:`MAX_PDUS_PER_TRANSACTION` PDUs and :data:`MAX_EDUS_PER_TRANSACTION` EDUs. PDUs
  leave in the order they were added (the sender adds them in stream order).
- **Backoff.** A failed transaction (the destination could not be reached, or answered
  with a 5xx) starts a back-off: the first interval is ``min_interval_ms``, each further
  failure multiplies it by ``multiplier`` and a jitter factor (Synapse draws it uniformly
  from [0.8, 1.4]; it is passed in here), capped at ``max_interval_ms``. Nothing is sent
  before ``retry_last_ts + retry_interval``. A success, or :meth:`reset_backoff` (the
  ``REMOTE_SERVER_UP`` command), clears it.
- **Catch-up, not an unbounded queue.** On failure the queued PDUs are dropped and the
  destination is *catching up*: PDUs added meanwhile are not queued either. The database
  records, per (destination, room), the stream ordering of the last event for it
  (``destination_rooms``) and the last stream ordering the destination acknowledged
  (``last_successful_stream_ordering``). Catching up sends, per room with a newer event,
  that room's latest event (oldest first, :data:`MAX_PDUS_PER_TRANSACTION` rooms per
  transaction); the remote fetches the events in between with ``get_missing_events``.
  When nothing newer is left the destination goes back to the live queue.
- **EDUs are kept** across failures (a newer EDU with the same key replaces the queued
  one: a user's typing state or presence); when the back-off grows past
  :data:`DROP_VOLATILE_EDUS_AFTER_MS` the volatile ones (typing, receipts, presence) are
  dropped, as Synapse does, while durable ones (to-device messages) stay.

Invariants (checked by ``tests/federation/test_destination_queue.py`` against a naive
model): within one run no PDU is planned twice after a transaction carrying it succeeded;
the PDUs a destination receives have increasing stream orderings; after the destination
recovers, every room with an event for it has its latest event delivered.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CATCH_UP_BATCH",
    "DROP_VOLATILE_EDUS_AFTER_MS",
    "MAX_EDUS_PER_TRANSACTION",
    "MAX_PDUS_PER_TRANSACTION",
    "BackoffPolicy",
    "DestinationQueue",
    "Edu",
    "LoadCatchUp",
    "PlannedTransaction",
    "QueuedPdu",
    "RetryState",
    "Step",
    "Wait",
]

#: The spec's limits on one transaction.
MAX_PDUS_PER_TRANSACTION = 50
MAX_EDUS_PER_TRANSACTION = 100
#: Rooms loaded per catch-up transaction (Synapse: 50).
CATCH_UP_BATCH = MAX_PDUS_PER_TRANSACTION
#: A back-off longer than this (one hour, unscaled) drops the queued volatile EDUs.
DROP_VOLATILE_EDUS_AFTER_MS = 60 * 60 * 1000


@dataclass(frozen=True)
class QueuedPdu:
    """A local event to send: its stream ordering orders it; ``pdu`` is its federation JSON."""

    event_id: str
    room_id: str
    stream_ordering: int
    pdu: Mapping[str, Any]


@dataclass(frozen=True, eq=False)
class Edu:
    """An EDU to send. ``key``: a newer EDU with the same key replaces a queued one
    (None: never replaced). ``durable``: kept however long the back-off (to-device).
    ``stream_id``: for a to-device message, its ``to_device`` stream ID (the sender
    records how far a destination has accepted them)."""

    edu_type: str
    content: Mapping[str, Any]
    key: tuple[str, ...] | None = None
    durable: bool = False
    stream_id: int | None = None

    def to_json(self, origin: str, destination: str) -> dict[str, Any]:
        return {
            "edu_type": self.edu_type,
            "content": dict(self.content),
            "origin": origin,
            "destination": destination,
        }


@dataclass(frozen=True)
class BackoffPolicy:
    """Synapse's destination back-off (``destination_min_retry_interval`` 10 min,
    ``destination_retry_multiplier`` 2, ``destination_max_retry_interval`` 7 days), every
    interval multiplied by ``scale`` (tests use a small one)."""

    min_interval_ms: int = 10 * 60 * 1000
    multiplier: float = 2.0
    max_interval_ms: int = 7 * 24 * 60 * 60 * 1000
    scale: float = 1.0

    @property
    def first_interval_ms(self) -> int:
        return max(1, int(self.min_interval_ms * self.scale))

    @property
    def cap_ms(self) -> int:
        return max(1, int(self.max_interval_ms * self.scale))

    def next_interval(self, current_ms: int, jitter: float) -> int:
        """The interval after one more failure; ``jitter`` in [0.8, 1.4] as Synapse draws."""
        if current_ms <= 0:
            return self.first_interval_ms
        return min(int(current_ms * self.multiplier * jitter), self.cap_ms)


@dataclass(frozen=True)
class RetryState:
    """A destination's back-off, as stored in ``destinations`` (times in ms).

    ``failure_ts``: when the current run of failures began (None: not failing)."""

    failure_ts: int | None = None
    retry_last_ts: int = 0
    retry_interval: int = 0

    @property
    def retry_at(self) -> int:
        return self.retry_last_ts + self.retry_interval if self.retry_interval else 0


@dataclass(frozen=True)
class PlannedTransaction:
    """A transaction to send now (the sender gives it a transaction ID)."""

    pdus: tuple[QueuedPdu, ...]
    edus: tuple[Edu, ...]
    catch_up: bool


@dataclass(frozen=True)
class Wait:
    """Nothing to send before ``until`` (ms); None: until something is added."""

    until: int | None


@dataclass(frozen=True)
class LoadCatchUp:
    """Load, per room with an event for this destination after ``after`` (None: any),
    that room's latest event, at most ``limit`` rooms, oldest first; report them with
    :meth:`DestinationQueue.catch_up_loaded`."""

    after: int | None
    limit: int = CATCH_UP_BATCH


Step = PlannedTransaction | Wait | LoadCatchUp


@dataclass
class _InFlight:
    transaction: PlannedTransaction
    #: The queued EDU entries it carries: removed on success only if still the same.
    edu_entries: list[tuple[object, Edu]] = field(default_factory=list)


class DestinationQueue:
    """The queue and retry state of one destination (see the module docstring)."""

    def __init__(
        self,
        destination: str,
        policy: BackoffPolicy,
        *,
        last_successful_stream_ordering: int | None = None,
        retry: RetryState | None = None,
        catching_up: bool = False,
    ) -> None:
        self.destination = destination
        self.policy = policy
        self.last_successful_stream_ordering = last_successful_stream_ordering
        self.retry = retry or RetryState()
        #: True while PDUs come from the database (``destination_rooms``), not the queue.
        self.catching_up = catching_up
        self._pdus: deque[QueuedPdu] = deque()
        self._edus: dict[object, Edu] = {}
        self._unkeyed = itertools.count()
        self._in_flight: _InFlight | None = None
        self._loading = False
        self._catch_up_pdus: list[QueuedPdu] = []
        #: The highest stream ordering not queued because we were catching up.
        self._last_skipped = 0

    # -- feeding ---------------------------------------------------------------------

    @property
    def pending_pdu_count(self) -> int:
        return len(self._pdus)

    @property
    def pending_edu_count(self) -> int:
        return len(self._edus)

    @property
    def in_flight(self) -> bool:
        return self._in_flight is not None

    def add_pdu(self, pdu: QueuedPdu) -> None:
        """Queue a PDU (after its ``destination_rooms`` row is stored): while catching up
        it is only remembered as skipped, as catch-up will find it in the database."""
        if self.catching_up:
            self._last_skipped = max(self._last_skipped, pdu.stream_ordering)
            return
        self._pdus.append(pdu)

    def add_edu(self, edu: Edu) -> None:
        if edu.key is None:
            self._edus[("unkeyed", next(self._unkeyed))] = edu
            return
        key = ("keyed", edu.key)
        # Re-insert so the newest is sent last, after older unrelated EDUs.
        self._edus.pop(key, None)
        self._edus[key] = edu

    # -- deciding --------------------------------------------------------------------

    def next_step(self, now_ms: int) -> Step:
        """What the sender should do now (never two transactions at once)."""
        if self._in_flight is not None or self._loading:
            return Wait(None)
        retry_at = self.retry.retry_at
        if retry_at and now_ms < retry_at:
            return Wait(retry_at)
        edus = list(itertools.islice(self._edus.items(), MAX_EDUS_PER_TRANSACTION))
        if self.catching_up:
            if not self._catch_up_pdus:
                self._loading = True
                return LoadCatchUp(self.last_successful_stream_ordering)
            pdus = tuple(self._catch_up_pdus[:MAX_PDUS_PER_TRANSACTION])
            return self._plan(pdus, edus, catch_up=True)
        pdus = tuple(itertools.islice(self._pdus, MAX_PDUS_PER_TRANSACTION))
        if not pdus and not edus:
            return Wait(None)
        return self._plan(pdus, edus, catch_up=False)

    def _plan(
        self, pdus: tuple[QueuedPdu, ...], edus: list[tuple[object, Edu]], *, catch_up: bool
    ) -> PlannedTransaction:
        planned = PlannedTransaction(pdus, tuple(e for _, e in edus), catch_up)
        self._in_flight = _InFlight(planned, edus)
        return planned

    def catch_up_loaded(self, pdus: Sequence[QueuedPdu]) -> None:
        """The answer to :class:`LoadCatchUp` (ascending stream orderings). Empty: caught
        up, unless a PDU was skipped after the load may have looked (then load again)."""
        self._loading = False
        if pdus:
            self._catch_up_pdus = sorted(pdus, key=lambda p: p.stream_ordering)
            return
        last = self.last_successful_stream_ordering
        if self._last_skipped and (last is None or self._last_skipped > last):
            # The skipped PDU's row is stored before it is added, but perhaps after the
            # load's snapshot: load once more (that load sees it; a PDU skipped later
            # sets this again).
            self._last_skipped = 0
            return
        self.catching_up = False

    def catch_up_load_failed(self) -> None:
        """The catch-up load raised: try again at the next step."""
        self._loading = False

    # -- outcomes --------------------------------------------------------------------

    def on_success(self, now_ms: int) -> bool:
        """The in-flight transaction was accepted. Returns True if the destination was
        failing before (it is up again: the sender says ``REMOTE_SERVER_UP``)."""
        del now_ms  # symmetry with on_failure; a success needs no time
        self._settle(self._take_in_flight())
        was_failing = self.retry.failure_ts is not None
        self.retry = RetryState()
        return was_failing

    def on_failure(self, now_ms: int, jitter: float = 1.0) -> RetryState:
        """The in-flight transaction failed (unreachable, or a 5xx): drop the queued PDUs,
        catch up later, back off. Returns the new retry state (the sender stores it)."""
        self._take_in_flight()
        self._drop_pdus_and_catch_up()
        interval = self.policy.next_interval(self.retry.retry_interval, jitter)
        self.retry = RetryState(
            failure_ts=self.retry.failure_ts if self.retry.failure_ts is not None else now_ms,
            retry_last_ts=now_ms,
            retry_interval=interval,
        )
        if interval > DROP_VOLATILE_EDUS_AFTER_MS * self.policy.scale:
            self._edus = {k: e for k, e in self._edus.items() if e.durable}
        return self.retry

    def on_rejected(self) -> None:
        """The destination refused the transaction itself (a 4xx other than 429): it will
        never accept it, so it is not retried (catch-up does not send its PDUs again
        either), and (as Synapse) no back-off starts."""
        self._settle(self._take_in_flight())

    def _settle(self, flight: _InFlight) -> PlannedTransaction:
        """Take what ``flight`` carried off the queues (EDUs only if not replaced since)."""
        for key, edu in flight.edu_entries:
            if self._edus.get(key) is edu:
                del self._edus[key]
        planned = flight.transaction
        if planned.catch_up:
            sent = {p.event_id for p in planned.pdus}
            self._catch_up_pdus = [p for p in self._catch_up_pdus if p.event_id not in sent]
        else:
            # Only a success or a refusal settles, and nothing but a failure clears the
            # queue, so the carried PDUs are still its head.
            for _ in planned.pdus:
                self._pdus.popleft()
        if planned.pdus:
            newest = max(p.stream_ordering for p in planned.pdus)
            last = self.last_successful_stream_ordering
            self.last_successful_stream_ordering = newest if last is None else max(last, newest)
        return planned

    def _take_in_flight(self) -> _InFlight:
        flight = self._in_flight
        if flight is None:
            raise RuntimeError(f"no transaction in flight to {self.destination}")
        self._in_flight = None
        return flight

    def _drop_pdus_and_catch_up(self) -> None:
        self._pdus.clear()
        self._catch_up_pdus = []
        self.catching_up = True

    def reset_backoff(self) -> None:
        """The destination may be up (``REMOTE_SERVER_UP``): try again at the next step."""
        self.retry = RetryState(failure_ts=self.retry.failure_ts)

    def start_catching_up(self) -> None:
        """At start-up, for a destination the database says has missed events."""
        self._drop_pdus_and_catch_up()


def newest_per_room(pdus: Iterable[QueuedPdu]) -> list[QueuedPdu]:
    """Each room's newest PDU, oldest first: what catch-up sends (the naive reference)."""
    newest: dict[str, QueuedPdu] = {}
    for pdu in pdus:
        held = newest.get(pdu.room_id)
        if held is None or pdu.stream_ordering > held.stream_ordering:
            newest[pdu.room_id] = pdu
    return sorted(newest.values(), key=lambda p: p.stream_ordering)
