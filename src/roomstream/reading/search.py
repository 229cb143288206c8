"""Full-text search of room events (``POST /search``): the index, written when events are
persisted, and the read, which finds only what the user may see.

**The index** (``event_search``, migration 0017) holds one row per searchable timeline
event: ``m.room.message`` (``content.body``), ``m.room.name`` (``content.name``) and
``m.room.topic`` (``content.topic``), the keys Synapse searches. An ``m.room.encrypted``
event has no plaintext on the server and is never indexed. :class:`SearchIndexer` is a
persist participant (:mod:`roomstream.rooms.participants`): the rows are written in the
persister's transaction, so an event is searchable exactly when it is stored. The engine
decides the index (:class:`SearchEngine`): an FTS5 table on SQLite (bm25 rank), a
``tsvector`` column with a GIN index on PostgreSQL (``ts_rank_cd``); both see the same
rows and answer the same query language (every word of the search term, as a prefix).

**The read** (:class:`RoomSearch`) matches in the rooms the user has a membership record
in (joined, or once joined, invited, left, banned), then keeps only the events the
visibility records let them see (:mod:`roomstream.reading.visibility`: a user who joined
late under ``joined`` finds nothing from before their join; one who left finds nothing
after their leave) and that no accepted redaction has pruned (the index keeps the words
a redaction removed; the read never serves them). Invariant: every result, context event
and count is one the user may see by the same rules as ``/messages``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from roomstream.errors import InvalidParamError
from roomstream.events.types import EventTypes
from roomstream.reading.events import EventFormatter, EventRead, _Loaded
from roomstream.reading.format import ClientEvent
from roomstream.reading.room_state import RoomStateReads, _state_after_txn
from roomstream.reading.timeline_rows import (
    _COLUMNS,
    MAX_LIMIT,
    MAX_POSITION,
    MIN_POSITION,
    _load_views_txn,
    _marks,
    _page_txn,
    _Row,
    _to_row,
    _View,
)
from roomstream.reading.tokens import InvalidTokenError, RoomPosition
from roomstream.rooms.participants import TimelineInput
from roomstream.storage import Database, Transaction

__all__ = [
    "SEARCH_KEYS",
    "RoomSearch",
    "SearchContext",
    "SearchHit",
    "SearchIndexer",
    "SearchQuery",
    "SearchResults",
    "search_terms",
]

#: The searchable keys, and the event type whose content holds each (as Synapse).
SEARCH_KEYS: Mapping[str, str] = {
    "content.body": EventTypes.MESSAGE,
    "content.name": EventTypes.NAME,
    "content.topic": EventTypes.TOPIC,
}
_KEY_OF_TYPE = {event_type: key for key, event_type in SEARCH_KEYS.items()}

#: Matches ordered by rank examined at most (Synapse's ``search_msgs`` reads 500).
RANK_CANDIDATES = 500
#: Matches ordered by time examined per request at most (a page reads on from there).
RECENT_CANDIDATES = 1000
#: Words of a search term used at most.
MAX_TERMS = 32
#: Index rows written per statement (5 parameters each: well under either engine's limit).
_INSERT_BATCH = 500

_WORD = re.compile(r"\w+")
_BATCH = re.compile(r"r(-?[0-9]{1,19})(?:~(!.{1,255}))?")


def search_terms(search_term: str) -> list[str]:
    """The words of a search term (lower case, in order, without repeats): each must
    occur in a result, as a word or a word's beginning."""
    words = dict.fromkeys(w.lower() for w in _WORD.findall(search_term))
    return list(words)[:MAX_TERMS]


# -- the engines -------------------------------------------------------------------------


class SearchEngine(Protocol):
    """One engine's full-text index: how rows are written and how matches are read.

    ``match_sql`` returns a query of ``t.room_id, {_COLUMNS}, sender, type, rank`` rows
    (timeline rows of matching events, higher rank better) in ``rooms``, with one of
    ``keys``, ordered as asked, before ``before`` (a stream ordering) if given, at most
    ``limit``."""

    def insert_txn(self, txn: Transaction, rows: Sequence[tuple[str, str, str, str, int]]) -> None:
        """Index ``(event_id, room_id, key, value, stream_ordering)`` rows; a row for an
        event that has one already is skipped (so indexing is idempotent: the rebuild,
        ``roomstream.reading.index_backfill``, may meet events the persister indexed)."""
        ...

    def match_sql(
        self,
        terms: Sequence[str],
        rooms: Sequence[str],
        keys: Sequence[str],
        order: Literal["rank", "recent"],
        before: int | None,
        limit: int,
    ) -> tuple[str, list[Any]]: ...


_SELECT = f"t.room_id, {_COLUMNS}, ev.sender, ev.type"
_JOIN = (
    " JOIN timeline_events t ON t.event_id = s.event_id JOIN events ev ON ev.event_id = s.event_id"
)


def _where(rooms: Sequence[str], keys: Sequence[str], before: int | None) -> tuple[str, list[Any]]:
    sql = f" AND s.room_id IN ({_marks(len(rooms))}) AND s.key IN ({_marks(len(keys))})"
    params: list[Any] = [*rooms, *keys]
    if before is not None:
        sql += " AND t.stream_ordering < ?"
        params.append(before)
    return sql, params


def _order(order: str) -> str:
    return "score DESC, t.stream_ordering DESC" if order == "rank" else "t.stream_ordering DESC"


class SqliteSearch:
    """FTS5: each word a quoted prefix query, AND-ed; rank is ``-bm25`` (bm25 is lower
    for better matches). A row's ``rowid`` is its event's stream ordering (unique, as
    ``events``' key): FTS5 has no unique constraint, and the rowid is the one column it
    can look up without a scan, so this is how an event's row is found.

    Written batch-wise, one statement per :data:`_INSERT_BATCH` rows, with no lookup
    first: ``OR REPLACE`` is FTS5's one conflict mode on the rowid (``OR IGNORE`` is
    refused), and a row already there (a rebuild over indexed events) is the same
    event's, replaced by an identical one: still one row per event."""

    def insert_txn(self, txn: Transaction, rows: Sequence[tuple[str, str, str, str, int]]) -> None:
        for start in range(0, len(rows), _INSERT_BATCH):
            batch = rows[start : start + _INSERT_BATCH]
            txn.execute(
                "INSERT OR REPLACE INTO event_search (rowid, event_id, room_id, key, value)"
                f" VALUES {', '.join(['(?, ?, ?, ?, ?)'] * len(batch))}",
                [v for r in batch for v in (r[4], r[0], r[1], r[2], r[3])],
            )

    def match_sql(
        self,
        terms: Sequence[str],
        rooms: Sequence[str],
        keys: Sequence[str],
        order: Literal["rank", "recent"],
        before: int | None,
        limit: int,
    ) -> tuple[str, list[Any]]:
        # Words are \w+ runs: no quote can end the phrase early.
        expression = " AND ".join(f'"{t}"*' for t in terms)
        where, params = _where(rooms, keys, before)
        return (
            f"SELECT {_SELECT}, -bm25(event_search) AS score FROM event_search s{_JOIN}"
            f" WHERE event_search MATCH ?{where} ORDER BY {_order(order)} LIMIT ?",
            [expression, *params, limit],
        )


class PostgresSearch:
    """``to_tsvector('english', value)`` in a GIN-indexed column; each word a prefix
    (``word:*``), AND-ed; rank is ``ts_rank_cd``. Written batch-wise as on SQLite (one
    statement per :data:`_INSERT_BATCH` rows; an event indexed already is skipped by its
    key)."""

    def insert_txn(self, txn: Transaction, rows: Sequence[tuple[str, str, str, str, int]]) -> None:
        for start in range(0, len(rows), _INSERT_BATCH):
            batch = rows[start : start + _INSERT_BATCH]
            txn.execute(
                "INSERT INTO event_search (event_id, room_id, key, vector) VALUES "
                + ", ".join(["(?, ?, ?, to_tsvector('english', ?))"] * len(batch))
                + " ON CONFLICT (event_id) DO NOTHING",
                [v for r in batch for v in r[:4]],
            )

    def match_sql(
        self,
        terms: Sequence[str],
        rooms: Sequence[str],
        keys: Sequence[str],
        order: Literal["rank", "recent"],
        before: int | None,
        limit: int,
    ) -> tuple[str, list[Any]]:
        expression = " & ".join(f"{t}:*" for t in terms)
        where, params = _where(rooms, keys, before)
        return (
            f"SELECT {_SELECT}, ts_rank_cd(s.vector, q.query) AS score"
            " FROM (SELECT to_tsquery('english', ?) AS query) q"
            f" JOIN event_search s ON s.vector @@ q.query{_JOIN}"
            f" WHERE TRUE{where} ORDER BY {_order(order)} LIMIT ?",
            [expression, *params, limit],
        )


def search_engine(engine_name: str) -> SearchEngine:
    """The index of a database engine (``sqlite`` or ``postgres``)."""
    return SqliteSearch() if engine_name == "sqlite" else PostgresSearch()


# -- the index ---------------------------------------------------------------------------


def searchable_text(event_type: str, content: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(key, text)`` to index for an event, or None: only the three searchable types,
    and only a string value (an encrypted event, or a malformed one, has none)."""
    key = _KEY_OF_TYPE.get(event_type)
    if key is None:
        return None
    value = content.get(key.removeprefix("content."))
    if not isinstance(value, str) or not value:
        return None
    # NUL cannot be stored in PostgreSQL text; it separates nothing a user would search.
    return key, value.replace("\x00", " ")


class SearchIndexer:
    """The persist participant that writes ``event_search`` (its one writer).

    Invariant: a timeline event (not an outlier, rejected or soft-failed) of a searchable
    type with a string value has exactly one row, written in the transaction that stores
    it; no other event has one."""

    def record_txn(self, txn: Transaction, room_id: str, items: Sequence[TimelineInput]) -> None:
        rows = []
        for item in items:
            if not item.in_timeline:
                continue
            event = item.event
            found = searchable_text(event.type, event.content)
            if found is not None:
                rows.append((event.event_id, room_id, found[0], found[1], item.stream_ordering))
        if rows:
            search_engine(txn.engine_name).insert_txn(txn, rows)


# -- the read ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SearchQuery:
    """A parsed ``room_events`` search (``POST /search``).

    ``keep``: the filter's predicate over an event's ``type``, ``sender`` and ``room_id``
    (None: all). ``rooms``/``not_rooms``: the filter's room lists. ``next_batch``: the
    token of a previous answer (``order="recent"`` only hands them out)."""

    search_term: str
    keys: tuple[str, ...] = tuple(SEARCH_KEYS)
    order: Literal["rank", "recent"] = "rank"
    limit: int = 10
    rooms: frozenset[str] | None = None
    not_rooms: frozenset[str] = frozenset()
    keep: Callable[[Mapping[str, Any]], bool] | None = None
    before_limit: int | None = None
    after_limit: int | None = None
    include_profile: bool = False
    include_state: bool = False
    group_by: tuple[str, ...] = ()
    next_batch: str | None = None

    @property
    def with_context(self) -> bool:
        return self.before_limit is not None


@dataclass
class SearchContext:
    """Around a result: visible events before (newest first) and after (oldest first),
    tokens to paginate further (``/messages``), and the senders' profiles at the result
    (``include_profile``)."""

    events_before: list[ClientEvent]
    events_after: list[ClientEvent]
    start: str
    end: str
    profile_info: dict[str, dict[str, Any]] | None = None


@dataclass
class SearchHit:
    rank: float
    event: ClientEvent
    context: SearchContext | None = None


@dataclass
class SearchResults:
    """The ``room_events`` category of the answer (see :meth:`as_json`). ``count``: the
    visible matches among those examined (the spec asks for an approximate count;
    Synapse counts matches the user may not see, which this does not)."""

    hits: list[SearchHit]
    count: int
    highlights: list[str]
    next_batch: str | None = None
    state: dict[str, list[ClientEvent]] | None = None
    groups: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        results = []
        for hit in self.hits:
            entry: dict[str, Any] = {"rank": hit.rank, "result": hit.event}
            if hit.context is not None:
                context: dict[str, Any] = {
                    "events_before": hit.context.events_before,
                    "events_after": hit.context.events_after,
                    "start": hit.context.start,
                    "end": hit.context.end,
                }
                if hit.context.profile_info is not None:
                    context["profile_info"] = hit.context.profile_info
                entry["context"] = context
            results.append(entry)
        body: dict[str, Any] = {
            "results": results,
            "count": self.count,
            "highlights": self.highlights,
        }
        if self.next_batch is not None:
            body["next_batch"] = self.next_batch
        if self.state is not None:
            body["state"] = self.state
        if self.groups:
            body["groups"] = self.groups
        return body


def _parse_batch(token: str) -> tuple[int, str | None]:
    match = _BATCH.fullmatch(token)
    if match is None:
        raise InvalidTokenError("unknown next_batch")
    return int(match[1]), match[2]


@dataclass
class _Found:
    """What the search transaction found: visible matching rows with their ranks, how
    many visible matches it examined, the context rows, and what formatting needs."""

    hits: list[tuple[_Row, str, float]]
    count: int
    more_from: int | None
    contexts: dict[str, tuple[list[_Row], list[_Row], dict[str, str]]]
    loaded: _Loaded | None


class RoomSearch(EventRead):
    """``POST /search`` over room events, as one user may see them."""

    def __init__(self, db: Database, formatter: EventFormatter, room_state: RoomStateReads) -> None:
        super().__init__(db, formatter)
        self._room_state = room_state

    async def search(
        self, user_id: str, query: SearchQuery, *, device_id: str | None = None
    ) -> SearchResults:
        """The visible matches of ``query`` for ``user_id`` (see the module docstring).

        ``order="rank"``: the best :data:`RANK_CANDIDATES` matches, best first, no
        ``next_batch`` (as Synapse). ``order="recent"``: newest first; ``next_batch``
        when more may follow (per room group too, restricting the next page to it)."""
        for key in query.keys:
            if key not in SEARCH_KEYS:
                raise InvalidParamError(f"unknown search key {key!r}")
        if not 1 <= query.limit <= MAX_LIMIT:
            raise InvalidParamError(f"limit must be 1..{MAX_LIMIT}")
        for n in (query.before_limit, query.after_limit):
            if n is not None and not 0 <= n <= MAX_LIMIT:
                raise InvalidParamError(f"event_context limits must be 0..{MAX_LIMIT}")
        before: int | None = None
        only_room: str | None = None
        if query.next_batch is not None:
            before, only_room = _parse_batch(query.next_batch)
        terms = search_terms(query.search_term)
        found = await self.db.run_interaction(
            "search_events",
            self._search_txn,
            user_id,
            query,
            terms,
            before,
            only_room,
            device_id,
        )
        return await self._answer(user_id, query, terms, found, only_room)

    def _search_txn(
        self,
        txn: Transaction,
        user_id: str,
        query: SearchQuery,
        terms: list[str],
        before: int | None,
        only_room: str | None,
        device_id: str | None,
    ) -> _Found:
        empty = _Found([], 0, None, {}, None)
        if not terms or not query.keys:
            return empty
        rooms = [
            str(r[0])
            for r in txn.query(
                "SELECT DISTINCT room_id FROM timeline_events WHERE member_user = ?", (user_id,)
            )
        ]
        rooms = sorted(
            r
            for r in rooms
            if (query.rooms is None or r in query.rooms)
            and r not in query.not_rooms
            and (only_room is None or r == only_room)
        )
        if not rooms:
            return empty
        views, _ = _load_views_txn(txn, rooms, user_id)
        budget = RANK_CANDIDATES if query.order == "rank" else RECENT_CANDIDATES
        sql, params = search_engine(txn.engine_name).match_sql(
            terms, rooms, query.keys, query.order, before, budget
        )
        rows = txn.query(sql, params)
        visible: list[tuple[_Row, str, float]] = []
        for r in rows:
            room_id, row = str(r[0]), _to_row(r[1:11])
            if row.redacted_by is not None or not views[room_id].visible(row):
                continue
            fields = {"type": r[12], "sender": r[11], "room_id": room_id}
            if query.keep is not None and not query.keep(fields):
                continue
            visible.append((row, room_id, float(r[13])))
        hits = visible[: query.limit]
        more_from = None
        if query.order == "recent":
            if len(visible) > query.limit:
                more_from = hits[-1][0].stream
            elif len(rows) >= budget:
                # Examined as many as one request may: the next page reads on from the
                # last one examined.
                more_from = int(rows[-1][2])
        contexts: dict[str, tuple[list[_Row], list[_Row], dict[str, str]]] = {}
        others: list[str] = []
        if query.with_context:
            for row, room_id, _ in hits:
                contexts[row.event_id] = self._context_txn(txn, views[room_id], room_id, row, query)
                others.extend(contexts[row.event_id][2].values())
        context_rows = [r for b, a, _ in contexts.values() for r in (*b, *a)]
        loaded = self._load_txn(
            txn, [h[0] for h in hits] + context_rows, others, user_id, device_id
        )
        return _Found(hits, len(visible), more_from, contexts, loaded)

    def _context_txn(
        self, txn: Transaction, view: _View, room_id: str, row: _Row, query: SearchQuery
    ) -> tuple[list[_Row], list[_Row], dict[str, str]]:
        position = row.position
        n_before, n_after = query.before_limit or 0, query.after_limit or 0
        before_rows = (
            _page_txn(txn, room_id, view, MIN_POSITION, position, True, n_before)
            if n_before
            else []
        )
        after_rows = (
            _page_txn(
                txn, room_id, view, (position[0], position[1] + 1), MAX_POSITION, False, n_after
            )
            if n_after
            else []
        )
        profiles: dict[str, str] = {}
        if query.include_profile:
            # The senders' member events in the state after the result (as Synapse,
            # which reads the state at the last event of the context).
            state = _state_after_txn(txn, row.event_id)
            senders = self._senders_txn(txn, [row, *before_rows, *after_rows])
            for sender in senders:
                member = state.get((EventTypes.MEMBER, sender))
                if member is not None:
                    profiles[sender] = member
        return before_rows, after_rows, profiles

    @staticmethod
    def _senders_txn(txn: Transaction, rows: Iterable[_Row]) -> list[str]:
        ids = [r.event_id for r in rows]
        found = txn.query(
            f"SELECT DISTINCT sender FROM events WHERE event_id IN ({_marks(len(ids))})", ids
        )
        return sorted(str(r[0]) for r in found)

    async def _answer(
        self,
        user_id: str,
        query: SearchQuery,
        terms: list[str],
        found: _Found,
        only_room: str | None,
    ) -> SearchResults:
        hits: list[SearchHit] = []
        if found.loaded is not None:
            loaded = found.loaded
            self._complete(loaded)
            now = self._now()
            for row, _room_id, rank in found.hits:
                event = self._format(row.event_id, row.replaces_state, loaded, now)
                context = None
                if query.with_context:
                    before_rows, after_rows, profiles = found.contexts[row.event_id]
                    first = before_rows[-1] if before_rows else row
                    last = after_rows[-1] if after_rows else row
                    context = SearchContext(
                        self._format_rows(before_rows, loaded, now),
                        self._format_rows(after_rows, loaded, now),
                        RoomPosition.of_event(*first.position).to_string(),
                        RoomPosition.after_event(*last.position).to_string(),
                        _profiles(profiles, loaded) if query.include_profile else None,
                    )
                hits.append(SearchHit(rank, event, context))
        next_batch = None
        if found.more_from is not None:
            suffix = "" if only_room is None else f"~{only_room}"
            next_batch = f"r{found.more_from}{suffix}"
        results = SearchResults(hits, found.count, terms, next_batch)
        if query.include_state:
            results.state = {}
            for room_id in dict.fromkeys(r for _, r, _ in found.hits):
                view = await self._room_state.room_state_for(user_id, room_id)
                results.state[room_id] = view.state
        for key in query.group_by:
            results.groups[key] = _group(key, found, query.order, next_batch is not None)
        return results


def _profiles(member_events: Mapping[str, str], loaded: _Loaded) -> dict[str, dict[str, Any]]:
    """Display name and avatar of each sender, from their member event's content."""
    profiles: dict[str, dict[str, Any]] = {}
    for sender, event_id in member_events.items():
        entry = loaded.formatted.get(event_id)
        content = {} if entry is None else entry.base.get("content", {})
        profile: dict[str, Any] = {}
        for name in ("displayname", "avatar_url"):
            if isinstance(content.get(name), str):
                profile[name] = content[name]
        profiles[sender] = profile
    return profiles


def _group(key: str, found: _Found, order: str, more: bool) -> dict[str, dict[str, Any]]:
    """The ``groups`` entry for ``room_id`` or ``sender``: each group's event IDs in
    result order and its ``order`` (its place among the groups: the rank of its best
    result, or the newest result's stream position). With more to read (``order`` recent),
    each room group gets a ``next_batch`` that reads on in that room only (as Synapse)."""
    groups: dict[str, dict[str, Any]] = {}
    for row, room_id, rank in found.hits:
        name = room_id if key == "room_id" else _sender_of(found, row)
        entry = groups.setdefault(
            name, {"results": [], "order": rank if order == "rank" else row.stream}
        )
        entry["results"].append(row.event_id)
    if more and key == "room_id" and found.more_from is not None:
        for room_id, entry in groups.items():
            entry["next_batch"] = f"r{found.more_from}~{room_id}"
    return groups


def _sender_of(found: _Found, row: _Row) -> str:
    assert found.loaded is not None
    entry = found.loaded.formatted.get(row.event_id)
    return "" if entry is None else str(entry.base.get("sender", ""))
