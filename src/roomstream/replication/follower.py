"""The reader side of replication, without I/O: which facts of which writer are processed.

A :class:`StreamFollower` holds, for every followed ``(stream, writer)``, the last token
whose facts this process has processed. Transports open one :class:`FollowerSession` per
connection (one TCP connection to a writer, or one Redis subscription) and feed it every
``RDATA`` and ``POSITION`` in arrival order. The session decides what to process, what to
drop and when rows are missing; fetching missing rows is the caller's job (it is I/O), and
:func:`fill_gap` does it through any ``fetch`` callable.

Rules (see ``docs/replication.md``, "Following streams"):

- RDATA for a ``(stream, writer)`` is ignored until a POSITION for it has arrived on the
  same session: a fresh connection may deliver live rows before the answer to REPLICATE,
  and only that answer says where the connection's rows start.
- RDATA with the token ``batch`` are buffered until the RDATA that carries the token; the
  token's rows are then processed together, once.
- A token at or below the processed token is a duplicate and is dropped (with its batch).
- POSITION(prev, new): if ``prev`` is beyond the processed token, the rows in
  ``(processed, new]`` were missed and must be fetched out of band (a :class:`Gap`);
  otherwise the writer wrote nothing in ``(processed, new]`` and processed becomes ``new``.

Invariants, for each ``(stream, writer)``:

- ``processed`` never decreases (except for an in-memory stream whose writer restarted,
  which announces a lower position: that is a new epoch, see :meth:`FollowerSession.handle`);
- every processed token was announced by the writer (RDATA token, POSITION token, or a
  page bound of its ``get_updates``), so a writer's position is never advanced past an
  incomplete fact;
- a token's rows are handed to ``process`` at most once and in ascending token order, and
  no token between two processed ones is skipped as long as fetches return what the
  writer committed.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from roomstream.replication.commands import Command, PositionCommand, RdataCommand

__all__ = [
    "FetchUpdates",
    "FollowerCallbacks",
    "FollowerSession",
    "Gap",
    "StreamFollower",
    "fill_gap",
]

Row = Any
Key = tuple[str, str]

#: ``fetch(stream, writer, from_token, upto_token, limit) -> (updates, new_upto, limited)``,
#: the ``get_updates`` contract (``docs/streams.md``, "Reading updates").
FetchUpdates = Callable[
    [str, str, int, int, int], Awaitable[tuple[list[tuple[int, Row]], int, bool]]
]


class FollowerCallbacks(Protocol):
    """What a follower does with facts; both methods are called synchronously."""

    def process(self, stream_name: str, writer: str, token: int, rows: list[Row]) -> None:
        """Handle every row of one token (called once per token, ascending per writer)."""

    def advanced(self, stream_name: str, writer: str, token: int) -> None:
        """The processed token of ``(stream, writer)`` moved to ``token``.

        Called after ``process`` for a token with rows, and alone when a POSITION moves
        the writer without rows. Readers advance their ``StreamIdGenerator`` here.
        """


@dataclass(frozen=True, slots=True)
class Gap:
    """Rows of ``writer`` in ``(from_token, upto_token]`` were missed and must be fetched."""

    stream_name: str
    writer: str
    from_token: int
    upto_token: int


class StreamFollower:
    """Processed tokens of every followed ``(stream, writer)``, shared by all sessions.

    ``start`` gives the starting token for pairs already known (a reader starts at the
    positions it loaded from the database: facts at or below them count as processed).
    A followed pair without a start takes the first POSITION it receives as its start.
    ``in_memory`` names streams whose writer restarts its tokens (typing): a POSITION below
    the processed token there starts a new epoch instead of being ignored.
    """

    def __init__(
        self,
        callbacks: FollowerCallbacks,
        streams: Collection[str],
        start: Mapping[Key, int] | None = None,
        *,
        instance_name: str | None = None,
        in_memory: Collection[str] = (),
    ) -> None:
        self.callbacks = callbacks
        self.streams = frozenset(streams)
        self.instance_name = instance_name
        self.in_memory = frozenset(in_memory)
        self._processed: dict[Key, int] = dict(start or {})
        #: The highest token each writer has announced (RDATA or POSITION), and since when
        #: (monotonic clock) the oldest announced fact has been waiting: for lag metrics.
        self._announced: dict[Key, int] = {}
        self._behind_since: dict[Key, float] = {}
        #: How many times an in-memory writer's epoch changed or its rows were lost.
        self.resets = 0

    def processed(self, stream_name: str, writer: str) -> int | None:
        """The last processed token, or None if nothing is known of that writer yet."""
        return self._processed.get((stream_name, writer))

    def positions(self) -> dict[str, dict[str, int]]:
        """``{stream: {writer: processed token}}`` (a snapshot)."""
        out: dict[str, dict[str, int]] = {}
        for (stream, writer), token in sorted(self._processed.items()):
            out.setdefault(stream, {})[writer] = token
        return out

    def lag(self) -> dict[Key, tuple[int, float]]:
        """``{(stream, writer): (tokens behind, seconds behind)}``: how far the processed
        token trails the highest one announced, and for how long facts have waited."""
        now = time.monotonic()
        out = {}
        for key, announced in self._announced.items():
            behind = max(0, announced - self._processed.get(key, announced))
            since = self._behind_since.get(key)
            out[key] = (behind, 0.0 if since is None or not behind else now - since)
        return out

    def is_caught_up(self, stream_name: str, writer: str) -> bool:
        """Every fact the writer has announced on any session has been processed."""
        key = (stream_name, writer)
        processed = self._processed.get(key)
        return processed is not None and processed >= self._announced.get(key, processed)

    def _heard(self, key: Key, token: int) -> None:
        if token > self._announced.get(key, token - 1):
            self._announced[key] = token
            if token > self._processed.get(key, token):
                self._behind_since.setdefault(key, time.monotonic())

    def _caught_up(self, key: Key) -> None:
        if self._processed.get(key, 0) >= self._announced.get(key, 0):
            self._behind_since.pop(key, None)

    def new_session(self) -> FollowerSession:
        """State for one new connection; nothing is positioned on it yet."""
        return FollowerSession(self)

    # -- used by sessions ---------------------------------------------------------------

    def _process(self, key: Key, token: int, rows: list[Row]) -> bool:
        current = self._processed.get(key)
        if current is not None and token <= current:
            return False
        self._processed[key] = token
        self._caught_up(key)
        self.callbacks.process(key[0], key[1], token, rows)
        self.callbacks.advanced(key[0], key[1], token)
        return True

    def _advance(self, key: Key, token: int) -> None:
        current = self._processed.get(key)
        if current is None or token > current:
            self._processed[key] = token
            self._caught_up(key)
            self.callbacks.advanced(key[0], key[1], token)

    def _reset(self, key: Key, token: int) -> None:
        self._processed[key] = token
        self._announced[key] = token
        self._caught_up(key)
        self.resets += 1


class FollowerSession:
    """One connection's view: which pairs are positioned, and batches being assembled."""

    __slots__ = ("_batches", "_follower", "_positioned", "closed")

    def __init__(self, follower: StreamFollower) -> None:
        self._follower = follower
        self._positioned: set[Key] = set()
        self._batches: dict[Key, list[Row]] = {}
        self.closed = False

    @property
    def follower(self) -> StreamFollower:
        return self._follower

    def is_positioned(self, stream_name: str, writer: str) -> bool:
        return (stream_name, writer) in self._positioned

    def is_live(self, stream_name: str, writer: str) -> bool:
        """Whether facts of ``(stream, writer)`` reach this process as they are written:
        the one definition of a *live* link, used by every transport.

        Live means: this session's connection is up (``closed`` is set by the transport
        the moment it learns the connection is lost), the writer has told this session
        where its rows start (a POSITION arrived here), and every fact it announced has
        been processed (no gap being fetched, no batch pending). A fact written after that
        moment reaches this process in milliseconds; while not live it may never arrive
        until a new session catches up, so caches kept correct by the stream must not be
        trusted (see :class:`~roomstream.accounts.token_cache.TokenCache`).
        """
        return (
            not self.closed
            and (stream_name, writer) in self._positioned
            and (stream_name, writer) not in self._batches
            and self._follower.is_caught_up(stream_name, writer)
        )

    def handle(self, cmd: Command) -> Gap | None:
        """Apply one received command; a :class:`Gap` means "fetch this, then continue".

        While a gap is outstanding the caller must not feed this session more commands
        (it pauses reading); it calls :func:`fill_gap` (or :meth:`apply_updates` and
        :meth:`advance_to` itself) and then carries on with the next command.
        """
        if self.closed:
            return None
        if type(cmd) is RdataCommand:
            self.on_rdata(cmd)
            return None
        if type(cmd) is PositionCommand:
            return self.on_position(cmd)
        return None

    def on_rdata(self, cmd: RdataCommand) -> None:
        follower = self._follower
        stream, writer, token, row = cmd
        if stream not in follower.streams or writer == follower.instance_name:
            return
        key = (stream, writer)
        if key not in self._positioned:
            return
        if token is not None:
            follower._heard(key, token)
        if token is None:
            batch = self._batches.get(key)
            if batch is None:
                self._batches[key] = [row]
            else:
                batch.append(row)
            return
        batch = self._batches.pop(key, None)
        if batch is None:
            follower._process(key, token, [row])
        else:
            batch.append(row)
            follower._process(key, token, batch)

    def on_position(self, cmd: PositionCommand) -> Gap | None:
        follower = self._follower
        stream, writer, prev, new = cmd
        if stream not in follower.streams or writer == follower.instance_name:
            return None
        key = (stream, writer)
        self._positioned.add(key)
        # A writer never puts a POSITION between the rows of one token; drop any leftovers.
        self._batches.pop(key, None)
        follower._heard(key, new)
        current = follower._processed.get(key)
        if current is None:
            follower._advance(key, new)
            return None
        if new < current and stream in follower.in_memory:
            # The in-memory writer restarted and counts from a new epoch.
            follower._reset(key, new)
            return None
        if prev > current:
            return Gap(stream, writer, current, new)
        follower._advance(key, new)
        return None

    def apply_updates(self, gap: Gap, updates: list[tuple[int, Row]]) -> None:
        """Process fetched updates (ascending, complete per token) for ``gap``'s writer."""
        if self.closed:
            return
        key = (gap.stream_name, gap.writer)
        follower = self._follower
        i = 0
        n = len(updates)
        while i < n:
            token = updates[i][0]
            rows = []
            while i < n and updates[i][0] == token:
                rows.append(updates[i][1])
                i += 1
            follower._process(key, token, rows)

    def advance_to(self, gap: Gap, token: int) -> None:
        """Every row of the writer up to ``token`` has been applied: move there."""
        if self.closed:
            return
        self._follower._advance((gap.stream_name, gap.writer), token)

    def skip_to(self, gap: Gap, token: int) -> None:
        """The rows cannot be fetched (an in-memory writer no longer holds them): reset."""
        if not self.closed:
            self._follower._reset((gap.stream_name, gap.writer), token)


async def fill_gap(
    session: FollowerSession, gap: Gap, fetch: FetchUpdates, *, limit: int = 1000
) -> None:
    """Fetch ``gap`` page by page and apply it, then move the writer to ``gap.upto_token``.

    Each page is complete up to its ``new_upto`` (``get_updates`` never splits a token),
    so advancing to it after applying the page skips nothing.
    """
    from_token = gap.from_token
    while from_token < gap.upto_token:
        updates, new_upto, limited = await fetch(
            gap.stream_name, gap.writer, from_token, gap.upto_token, limit
        )
        session.apply_updates(gap, updates)
        if limited and new_upto <= from_token:
            raise RuntimeError(f"get_updates made no progress past {from_token} for {gap}")
        session.advance_to(gap, min(new_upto, gap.upto_token))
        from_token = new_upto
        if not limited:
            break
    session.advance_to(gap, gap.upto_token)
