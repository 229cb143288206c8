"""Events as a viewer sees them, and the single-event reads.

:class:`EventFormatter` holds the formatting cache (each event's viewer-independent
client format, for the redaction it had when formatted) and turns the rows a read found
into client events: what formatting needs is read in the read's own transaction
(:meth:`EventFormatter.load_txn`), the formatting is done on the event loop
(:meth:`EventFormatter.complete`). Every read that serves events is an
:class:`EventRead`. Also here: one event by ID (:class:`SingleEvents`).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from roomstream.events.model import Event
from roomstream.events.types import EventTypes
from roomstream.lru import LruCache
from roomstream.reading.format import (
    ClientEvent,
    FormattedEvent,
    format_event,
    with_viewer_fields,
)
from roomstream.reading.timeline_rows import (
    _chunks,
    _load_views_txn,
    _marks,
    _Row,
    _timeline_row_txn,
)
from roomstream.rooms.store import EventStore, load_events_txn
from roomstream.storage import Database, Transaction


@dataclass
class _Loaded:
    """Everything formatting needs besides the rows, read in the transaction.

    ``formatted``: event ID -> its viewer-independent format, for the events whose format
    (for their current redaction) the reader's cache held; :meth:`EventFormatter.complete`
    adds the ``missing`` ones, formatted from ``events`` (those events and their
    redactions; ``fresh``: the ones read from the database). ``redacted_by``: event ID ->
    its accepted redaction. ``transaction_ids``: event ID -> the viewing device's.
    """

    formatted: dict[str, FormattedEvent]
    missing: list[str]
    events: dict[str, Event]
    fresh: list[Event]
    redacted_by: dict[str, str]
    transaction_ids: dict[str, str]


class EventFormatter:
    """The formatting cache and the formatting of every read (shared by all of them).

    Safe to share between requests: the cache is read by database interactions on
    worker threads (a plain get) and written on the event loop only."""

    def __init__(
        self,
        store: EventStore,
        *,
        clock: Callable[[], float] = time.time,
        include_age: bool = True,
        cache_size: int = 20_000,
    ) -> None:
        self.store = store
        self._clock = clock
        self._include_age = include_age
        # event ID -> the client format's viewer-independent part, for the redaction the
        # event had when formatted (a later redaction makes the entry a miss). Read by
        # database interactions on worker threads (a plain get), written on the loop.
        self._formatted: LruCache[str, FormattedEvent] = LruCache("formatted_events", cache_size)

    @property
    def cache(self) -> LruCache[str, FormattedEvent]:
        """The formatting cache (event ID -> format). Entries are read without reordering
        (from worker threads), so the oldest written goes first."""
        return self._formatted

    def now(self) -> int | None:
        return int(self._clock() * 1000) if self._include_age else None

    def load_txn(
        self,
        txn: Transaction,
        rows: Sequence[_Row],
        others: Iterable[str],
        user_id: str,
        device_id: str | None,
        known: Mapping[str, str | None] | None = None,
    ) -> _Loaded:
        """What formatting the events of ``rows`` and ``others`` (any other event IDs:
        state, ``prev_content`` sources) needs: redaction flags, the cached formats, the
        events whose format is not cached (from the store's cache where it has them), and
        the viewer's transaction IDs. The rows' redaction flags are the ones read with
        them, ``known`` those read with some of ``others``; the rest are read here.

        Once per event served, so the rows take one pass and cache hits load nothing.
        """
        cache_get = self._formatted.peek
        formatted: dict[str, FormattedEvent] = {}
        missing: list[str] = []
        redacted_by: dict[str, str] = {}
        extra: list[str] = []
        for row in rows:
            event_id, redaction = row.event_id, row.redacted_by
            entry = cache_get(event_id)
            if entry is not None and entry.redacted_by == redaction:
                formatted[event_id] = entry
            else:
                missing.append(event_id)
            if redaction is not None:
                redacted_by[event_id] = redaction
            if row.replaces_state is not None:
                extra.append(row.replaces_state)
        resolved = set(formatted).union(missing)
        pending = [e for e in dict.fromkeys(itertools.chain(others, extra)) if e not in resolved]
        known = known or {}
        redacted_by.update((e, r) for e in pending if (r := known.get(e)) is not None)
        unknown = [e for e in pending if e not in known]
        for chunk in _chunks(unknown):
            for event_id, redaction in txn.query(
                "SELECT event_id, redacted_by FROM events"
                f" WHERE event_id IN ({_marks(len(chunk))}) AND redacted_by IS NOT NULL",
                chunk,
            ):
                redacted_by[str(event_id)] = str(redaction)
        for event_id in pending:
            entry = cache_get(event_id)
            if entry is not None and entry.redacted_by == redacted_by.get(event_id):
                formatted[event_id] = entry
            else:
                missing.append(event_id)
        needed = [*missing, *(redacted_by[e] for e in missing if e in redacted_by)]
        events: dict[str, Event] = {}
        uncached = []
        for event_id in needed:
            event = self.store.cached_event(event_id)
            if event is None:
                uncached.append(event_id)
            else:
                events[event_id] = event
        fresh = load_events_txn(txn, uncached) if uncached else {}
        events.update(fresh)
        transaction_ids: dict[str, str] = {}
        if device_id is not None:
            own = []
            for event_id in itertools.chain(formatted, missing):
                entry = formatted.get(event_id)
                if entry is not None:
                    sender = entry.base["sender"]
                else:
                    event = events.get(event_id)
                    sender = None if event is None else event.sender
                if sender == user_id:
                    own.append(event_id)
            for chunk in _chunks(own):
                for event_id, txn_id in txn.query(
                    "SELECT event_id, txn_id FROM event_txn_ids"
                    f" WHERE event_id IN ({_marks(len(chunk))}) AND user_id = ? AND device_id = ?",
                    (*chunk, user_id, device_id),
                ):
                    transaction_ids[str(event_id)] = str(txn_id)
        return _Loaded(
            formatted, missing, events, list(fresh.values()), redacted_by, transaction_ids
        )

    def matching_txn(
        self,
        txn: Transaction,
        rows: Sequence[_Row],
        keep: Callable[[Mapping[str, Any]], bool],
    ) -> list[_Row]:
        """Those of ``rows`` (order kept) whose event ``keep`` accepts, given as
        ``type``, ``sender``, ``room_id``, ``content`` (empty for a redacted event: no
        redaction algorithm keeps what a filter reads, ``url``) and ``state_key`` for
        state events. The events come from the formatting cache or the store's, else
        from the database in one statement per 500."""
        fields: dict[str, Mapping[str, Any]] = {}
        uncached: list[str] = []
        peek = self._formatted.peek
        for row in rows:
            entry = peek(row.event_id)
            if entry is not None:
                fields[row.event_id] = entry.base
                continue
            event = self.store.cached_event(row.event_id)
            if event is None:
                uncached.append(row.event_id)
            else:
                fields[row.event_id] = _filter_fields(event, row.redacted_by)
        if uncached:
            flags = {r.event_id: r.redacted_by for r in rows}
            for event_id, event in load_events_txn(txn, uncached).items():
                fields[event_id] = _filter_fields(event, flags.get(event_id))
        return [r for r in rows if r.event_id in fields and keep(fields[r.event_id])]

    def complete(self, loaded: _Loaded) -> None:
        """On the event loop, after :meth:`load_txn`: cache the events read from the
        database, and format (and cache) those whose format was not cached."""
        self.store.cache_events(loaded.fresh)
        cache = self._formatted
        cache.count_lookups(len(loaded.formatted), len(loaded.missing))
        for event_id in loaded.missing:
            event = loaded.events.get(event_id)
            if event is None:
                continue  # not stored: callers skip it (or fail loudly, as before)
            redaction_id = loaded.redacted_by.get(event_id)
            redaction = None if redaction_id is None else loaded.events.get(redaction_id)
            entry = format_event(event, redaction)
            loaded.formatted[event_id] = entry
            cache.set(event_id, entry)

    def format_rows(
        self, rows: Iterable[_Row], loaded: _Loaded, now: int | None
    ) -> list[ClientEvent]:
        """The rows' events as the viewer sees them (after :meth:`complete`)."""
        formatted = loaded.formatted
        if loaded.transaction_ids:
            return [self.format(r.event_id, r.replaces_state, loaded, now) for r in rows]
        # Once per event served: the usual case (no prev_content, no transaction ID)
        # calls the formatter directly.
        return [
            with_viewer_fields(formatted[r.event_id], now_ms=now)
            if r.replaces_state is None
            else self.format(r.event_id, r.replaces_state, loaded, now)
            for r in rows
        ]

    def format_ids(
        self, event_ids: Iterable[str], loaded: _Loaded, now: int | None
    ) -> list[ClientEvent]:
        """Events (state, membership changes) as the viewer sees them, without
        ``prev_content`` (after :meth:`complete`)."""
        if loaded.transaction_ids:
            return [self.format(e, None, loaded, now) for e in event_ids]
        formatted = loaded.formatted
        return [with_viewer_fields(formatted[e], now_ms=now) for e in event_ids]

    def format(
        self, event_id: str, replaces: str | None, loaded: _Loaded, now: int | None
    ) -> ClientEvent:
        """``event_id`` as the viewer sees it (after :meth:`complete`). ``replaces``:
        the state event it replaced, whose (pruned) content is its ``prev_content``."""
        previous = None if replaces is None else loaded.formatted.get(replaces)
        if previous is None:
            return with_viewer_fields(
                loaded.formatted[event_id],
                transaction_id=loaded.transaction_ids.get(event_id),
                now_ms=now,
            )
        return with_viewer_fields(
            loaded.formatted[event_id],
            prev_content=previous.base["content"],
            replaces_state=replaces,
            transaction_id=loaded.transaction_ids.get(event_id),
            now_ms=now,
        )


def _filter_fields(event: Event, redacted_by: str | None) -> dict[str, Any]:
    """What a timeline filter reads of an event (see :meth:`EventFormatter.matching_txn`)."""
    fields: dict[str, Any] = {
        "type": event.type,
        "sender": event.sender,
        "room_id": event.room_id,
        "content": {} if redacted_by is not None else event.content,
    }
    if event.state_key is not None:
        fields["state_key"] = event.state_key
    return fields


class EventRead:
    """Base of the reads that serve events: the database, and the formatter's steps
    bound under the names the reads call (bound once here: no extra call per event)."""

    def __init__(self, db: Database, formatter: EventFormatter) -> None:
        self.db = db
        self.store = formatter.store
        self._now = formatter.now
        self._load_txn = formatter.load_txn
        self._complete = formatter.complete
        self._format_rows = formatter.format_rows
        self._format_ids = formatter.format_ids
        self._format = formatter.format
        self._matching_txn = formatter.matching_txn


class SingleEvents(EventRead):
    """One event by ID, as a user may see it."""

    async def get_event(
        self, user_id: str, event_id: str, *, device_id: str | None = None
    ) -> ClientEvent | None:
        """One event as the user may see it; None if unknown or not visible to them.

        Outliers are served only when they are the user's own membership events (an
        invite received out of band)."""
        raw = await self.db.run_interaction(
            "get_event", self._get_event_txn, user_id, event_id, device_id
        )
        if raw is None:
            return None
        replaces, loaded = raw
        self._complete(loaded)
        return self._format(event_id, replaces, loaded, self._now())

    def _get_event_txn(
        self, txn: Transaction, user_id: str, event_id: str, device_id: str | None
    ) -> tuple[str | None, _Loaded] | None:
        found = _timeline_row_txn(txn, event_id)
        if found is None:
            meta = txn.query_one(
                "SELECT type, state_key, outlier, rejected_reason FROM events WHERE event_id = ?",
                (event_id,),
            )
            if (
                meta is None
                or meta[0] != EventTypes.MEMBER
                or meta[1] != user_id
                or not meta[2]
                or meta[3] is not None
            ):
                return None
            return None, self._load_txn(txn, (), [event_id], user_id, device_id)
        room_id, row = found
        view = _load_views_txn(txn, [room_id], user_id)[0][room_id]
        if not view.visible(row):
            return None
        return row.replaces_state, self._load_txn(txn, [row], (), user_id, device_id)

    async def is_visible(self, user_id: str, event_id: str) -> bool:
        """May the user see this timeline event?"""

        def txn(t: Transaction) -> bool:
            found = _timeline_row_txn(t, event_id)
            if found is None:
                return False
            return _load_views_txn(t, [found[0]], user_id)[0][found[0]].visible(found[1])

        return await self.db.run_interaction("is_visible", txn)
