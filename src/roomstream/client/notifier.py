"""Waking long-polling requests (``/sync``) when something for their user is complete.

Facts arrive two ways: this process's own writes (each local stream's position listener:
the rows up to a stored position are complete) and replication (rows from
:class:`~roomstream.replication.follower.StreamFollower`, complete once their writer's
position reaches their token). Each row names the rooms and users it concerns; a waiter
registered for a user and the rooms it is in is woken only by rows about them.

Invariant: a waiter registered before its caller reads the streams is woken by every
relevant fact that completes after that read, so ``listen`` → read → wait never misses
one (nothing is polled). A row about everyone sharing a room with a user
(:func:`~roomstream.client.sync_sections.base.sharers_key`) wakes the rooms that user is
joined to once ``rooms_of`` has named them: later than the row's other keys, never not.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from roomstream.client.sync_sections import SECTIONS
from roomstream.client.sync_sections.base import SHARERS_PREFIX, room_key, user_key
from roomstream.streams import StreamSet

__all__ = ["Notifier", "Waiter", "keys_for_row"]

logger = logging.getLogger(__name__)

#: The name of the notifier's own reads of new rows (they serve waiting syncs, not a request).
NOTIFIER_READ = "notifier_new_rows"

#: Which rows wake a sync, per stream: the sync sections' (backfill and caches never do).
WakeKeys = Callable[[Sequence[Any]], list[str]]


def _wake_keys_by_stream() -> dict[str, WakeKeys]:
    """Each stream's wake keys: those of every section reading it (usually one)."""
    by_stream: dict[str, list[WakeKeys]] = {}
    for section in SECTIONS:
        by_stream.setdefault(section.stream, []).append(section.wake_keys)
    return {
        stream: found[0] if len(found) == 1 else _all_keys(tuple(found))
        for stream, found in by_stream.items()
    }


def _all_keys(each: tuple[WakeKeys, ...]) -> WakeKeys:
    return lambda row: [key for keys_of in each for key in keys_of(row)]


WAKE_KEYS: Mapping[str, WakeKeys] = MappingProxyType(_wake_keys_by_stream())


def keys_for_row(
    stream_name: str, row: Sequence[Any], wake_keys: Mapping[str, WakeKeys] = WAKE_KEYS
) -> list[str]:
    """The wake keys (:func:`~roomstream.client.sync_sections.base.user_key`,
    :func:`~roomstream.client.sync_sections.base.room_key`) a stream row concerns, as the
    section of its stream says (none for a stream no section reads)."""
    keys_of = wake_keys.get(stream_name)
    if keys_of is None:
        return []
    try:
        return keys_of(row)
    except (IndexError, TypeError, KeyError, ValueError, AttributeError):
        logger.warning("cannot tell whom a %s row concerns: %r", stream_name, row)
    return []


LocalRowListener = Callable[[str, str, int, int, list[tuple[int, Any]]], object]

#: The rooms a user is joined to now.
RoomsOf = Callable[[str], Awaitable[Iterable[str]]]


class Waiter:
    """One registration: :meth:`wait` returns when a relevant fact completed since it
    was made (or since the last wait)."""

    def __init__(self, keys: frozenset[str]) -> None:
        self.keys = keys
        self._event = asyncio.Event()

    def wake(self) -> None:
        self._event.set()

    async def wait(self, seconds: float) -> bool:
        """True if woken, False on timeout; either way ready to wait again."""
        try:
            await asyncio.wait_for(self._event.wait(), seconds)
            return True
        except TimeoutError:
            return False
        finally:
            self._event.clear()


class Notifier:
    def __init__(
        self, streams: StreamSet, instance_name: str, rooms_of: RoomsOf | None = None
    ) -> None:
        """``rooms_of``: the joined rooms of a user, to resolve ``sharers_key`` keys (None:
        those keys wake nobody)."""
        self.streams = streams
        self.instance_name = instance_name
        self.rooms_of = rooms_of
        #: Lookups of rooms for ``sharers_key`` keys under way.
        self._resolving: set[asyncio.Task[None]] = set()
        self._waiters: defaultdict[str, set[Waiter]] = defaultdict(set)
        self._notified: dict[str, int] = {}
        self._fetching: dict[str, asyncio.Task[None]] = {}
        self._closed = False
        self._pending: defaultdict[tuple[str, str], list[tuple[int, list[str]]]] = defaultdict(list)
        #: Called with (stream, writer, since, upto, updates) for every batch of local
        #: rows read here, before the syncs they concern are woken.
        self.local_row_listeners: list[LocalRowListener] = []
        for name in WAKE_KEYS:
            if name not in streams:
                continue
            generator = streams.generator(name)
            if generator.is_writer():
                self._notified[name] = streams.current_token(name, instance_name)
                generator.add_position_listener(functools.partial(self._local_advanced, name))

    # -- registering -------------------------------------------------------------------

    @contextlib.contextmanager
    def listen(self, user_id: str, room_ids: Iterable[str]) -> Iterator[Waiter]:
        waiter = Waiter(frozenset([user_key(user_id), *(room_key(r) for r in room_ids)]))
        for key in waiter.keys:
            self._waiters[key].add(waiter)
        try:
            yield waiter
        finally:
            # Unregistering costs a step per room of the user: done once the caller's
            # response is on its way (a wake of the finished waiter meanwhile is a no-op).
            try:
                asyncio.get_running_loop().call_soon(self._forget, waiter)
            except RuntimeError:  # no loop (closing): at once
                self._forget(waiter)

    def _forget(self, waiter: Waiter) -> None:
        for key in waiter.keys:
            waiters = self._waiters.get(key)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiters[key]

    def wake_keys(self, keys: Iterable[str]) -> None:
        woken: set[Waiter] = set()
        sharers: set[str] = set()
        for key in keys:
            if key.startswith(SHARERS_PREFIX):
                sharers.add(key[len(SHARERS_PREFIX) :])
            else:
                woken.update(self._waiters.get(key, ()))
        for waiter in woken:
            waiter.wake()
        # Nobody waiting here: nobody to wake in their rooms either (a sync that starts
        # later reads the rows itself).
        if sharers and self._waiters and self.rooms_of is not None and not self._closed:
            task = asyncio.get_running_loop().create_task(self._wake_rooms_of(sharers))
            self._resolving.add(task)
            task.add_done_callback(self._resolving.discard)

    async def _wake_rooms_of(self, user_ids: set[str]) -> None:
        """Wake the syncs of everyone in a room one of ``user_ids`` is joined to."""
        assert self.rooms_of is not None
        try:
            for user_id in sorted(user_ids):
                self.wake_keys(room_key(r) for r in await self.rooms_of(user_id))
        except Exception:
            logger.exception("reading users' rooms to wake the syncs there failed")

    def notify_rows(self, stream_name: str, rows: Iterable[Sequence[Any]]) -> None:
        """Rows that are complete now (an in-memory stream this process writes)."""
        self.wake_keys(k for row in rows for k in keys_for_row(stream_name, row))

    # -- local writes ------------------------------------------------------------------

    def close(self) -> None:
        """Stop reading local rows (the database is about to close); cancel reads."""
        self._closed = True
        for task in [*self._fetching.values(), *self._resolving]:
            task.cancel()

    def _local_advanced(self, stream_name: str, _writer: str, _position: int) -> None:
        if self._closed or stream_name in self._fetching:
            return  # the running fetch loops until it has caught up
        self._fetching[stream_name] = asyncio.get_running_loop().create_task(
            self._fetch_local(stream_name)
        )

    async def _fetch_local(self, stream_name: str) -> None:
        try:
            while True:
                start = self._notified[stream_name]
                upto = self.streams.current_token(stream_name, self.instance_name)
                if upto <= start:
                    return
                updates, upto, _ = await self.streams.get_updates(
                    stream_name,
                    self.instance_name,
                    start,
                    upto,
                    10_000,
                    transaction_name=NOTIFIER_READ,
                )
                self._notified[stream_name] = upto
                for listener in self.local_row_listeners:
                    listener(stream_name, self.instance_name, start, upto, updates)
                self.notify_rows(stream_name, (row for _, row in updates))
        except Exception:
            logger.exception("reading new %s rows to wake syncs failed", stream_name)
        finally:
            del self._fetching[stream_name]

    # -- replication -------------------------------------------------------------------

    def on_replicated_rows(
        self, stream_name: str, writer: str, token: int, rows: Sequence[Any]
    ) -> None:
        """Rows received from another writer; they wake syncs once its position reaches
        ``token`` (:meth:`on_replicated_position`)."""
        if stream_name not in WAKE_KEYS:
            return
        keys = [k for row in rows for k in keys_for_row(stream_name, row)]
        if keys:
            self._pending[(stream_name, writer)].append((token, keys))

    def on_replicated_position(self, stream_name: str, writer: str, position: int) -> None:
        pending = self._pending.get((stream_name, writer))
        if not pending:
            return
        ready = [keys for token, keys in pending if token <= position]
        if not ready:
            return
        pending[:] = [(t, k) for t, k in pending if t > position]
        self.wake_keys(k for keys in ready for k in keys)
