"""Stream positions without I/O: what one process knows about the writers of one stream.

Terms (see ``docs/streams.md``):

- A *fact* is reserved with a stream ID and later *completed* (committed or rolled back).
- The *position* of writer W is an ID p such that every fact W will ever complete with an
  ID <= p has completed already. Positions only move forward.
- The *linear position* is an ID p such that every fact of every writer with ID <= p has
  completed; it is the minimum of the writers' positions, so it never reaches an ID that
  is still in flight anywhere.

IDs come from one shared, increasing sequence. That gives the local writer a cheap but
strong claim: when it has nothing in flight and no reservation under way, it will never
complete anything at or below the highest ID it has seen allocated (``max_seen``), so it
may announce that as its position even if it wrote nothing there.

The tracker works in positive IDs. Negative streams (backfill) negate at the boundary.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence


class UnknownIdError(ValueError):
    """Completing an ID that is not in flight: a bookkeeping bug in the caller."""


class StreamPositionTracker:
    """Positions of every writer of one stream, as seen by one process.

    Invariants:

    - ``position(w)`` and ``linear_position`` never decrease;
    - ``position(local)`` is below every local ID still in flight, and below every ID a
      reservation still under way may return;
    - ``linear_position <= position(w)`` for every configured writer ``w``.
    """

    __slots__ = (
        "_completed",
        "_in_flight",
        "_in_flight_ids",
        "_linear",
        "_local",
        "_local_position",
        "_max_seen",
        "_next_fetch",
        "_pending_fetches",
        "_remote",
    )

    def __init__(
        self,
        writers: Sequence[str],
        local_instance: str | None,
        positions: dict[str, int],
        max_seen: int,
    ) -> None:
        """``positions`` holds a start position for every writer (the local one included)."""
        if not writers:
            raise ValueError("a stream needs at least one writer")
        self._local = local_instance if local_instance in writers else None
        self._remote = {w: positions[w] for w in writers if w != self._local}
        self._max_seen = max(max_seen, *positions.values())
        # Local IDs in flight as a min-heap; completed ones leave it lazily.
        self._in_flight: list[int] = []
        self._in_flight_ids: set[int] = set()
        self._completed: set[int] = set()
        # Reservations asking the database for IDs: token -> max_seen when they started.
        self._pending_fetches: dict[int, int] = {}
        self._next_fetch = 0
        self._local_position = positions[self._local] if self._local is not None else 0
        self._linear = 0
        self._recompute()

    # -- queries -------------------------------------------------------------------

    @property
    def local_instance(self) -> str | None:
        return self._local

    @property
    def writers(self) -> list[str]:
        writers = list(self._remote)
        if self._local is not None:
            writers.append(self._local)
        return sorted(writers)

    @property
    def linear_position(self) -> int:
        return self._linear

    @property
    def max_seen(self) -> int:
        """The highest ID known to have been allocated, by anyone."""
        return self._max_seen

    def position(self, writer: str) -> int:
        if writer == self._local:
            return self._local_position
        return self._remote[writer]

    def positions(self) -> dict[str, int]:
        """Every writer's position, keys sorted (stable for offsets and messages)."""
        return {w: self.position(w) for w in self.writers}

    def has_in_flight(self) -> bool:
        return bool(self._in_flight) or bool(self._pending_fetches)

    # -- local writer --------------------------------------------------------------

    def fetch_started(self) -> int:
        """A reservation is about to ask the sequence for IDs; returns a token for it.

        Until :meth:`fetch_finished`, the local position stays at or below the current
        ``max_seen``: the IDs the fetch returns will be above it.
        """
        if self._local is None:
            raise RuntimeError("this process is not a writer of the stream")
        token = self._next_fetch
        self._next_fetch += 1
        self._pending_fetches[token] = self._max_seen
        return token

    def fetch_finished(self, token: int, ids: Iterable[int]) -> None:
        """The fetch ``token`` returned ``ids`` (none if it failed); they are now in flight."""
        del self._pending_fetches[token]
        for stream_id in ids:
            heapq.heappush(self._in_flight, stream_id)
            self._in_flight_ids.add(stream_id)
            if stream_id > self._max_seen:
                self._max_seen = stream_id
        self._recompute()

    def complete(self, ids: Iterable[int]) -> None:
        """Facts ``ids`` are done (committed or rolled back): they will never change."""
        heap = self._in_flight
        for stream_id in ids:
            if stream_id not in self._in_flight_ids:
                raise UnknownIdError(f"ID {stream_id} is not in flight")
            self._in_flight_ids.discard(stream_id)
            self._completed.add(stream_id)
        if heap and heap[0] in self._completed:
            while heap and heap[0] in self._completed:
                self._completed.discard(heapq.heappop(heap))
            self._recompute()

    # -- other writers -------------------------------------------------------------

    def advance(self, writer: str, position: int) -> bool:
        """Writer ``writer`` announced ``position``; returns False if it told us nothing new.

        Announcements from the local writer or from writers not configured are ignored:
        the local one knows better, and an unknown writer's facts cannot be ordered
        against a writer set this process was not told about.
        """
        if position > self._max_seen:
            self._max_seen = position
        known = self._remote.get(writer)
        if known is None or position <= known:
            if writer == self._local or known is None:
                self._recompute()
            return False
        self._remote[writer] = position
        self._recompute()
        return True

    # -- internals -------------------------------------------------------------------

    def _recompute(self) -> None:
        if self._local is not None:
            bound = self._max_seen
            if self._in_flight:
                bound = min(bound, self._in_flight[0] - 1)
            if self._pending_fetches:
                bound = min(bound, *self._pending_fetches.values())
            if bound > self._local_position:
                self._local_position = bound
            linear = self._local_position
            if self._remote:
                linear = min(linear, min(self._remote.values()))
        else:
            linear = min(self._remote.values())
        if linear > self._linear:
            self._linear = linear
