"""Typing notifications: who is typing in each room, with timeouts, on the ``typing``
stream (held in its writer's memory; rows are ``(room_id, user_ids)``, the full list).

:class:`TypingState` is what any process knows: the latest list per room and the token
it came with. :class:`TypingWriter` (on the stream's writer) keeps each user's expiry,
appends a row whenever a room's list changes and drops users whose timeout passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Protocol

__all__ = ["MAX_TYPING_TIMEOUT_MS", "CallLater", "TypingState", "TypingWriter"]

#: Longest typing timeout honoured (Synapse caps it similarly).
MAX_TYPING_TIMEOUT_MS = 120_000


class TypingState:
    """Room -> (token of its latest row, users typing)."""

    def __init__(self) -> None:
        self._rooms: dict[str, tuple[int, list[str]]] = {}
        self.token = 0

    def apply(self, token: int, room_id: str, user_ids: Sequence[str]) -> None:
        self._rooms[room_id] = (token, list(user_ids))
        self.token = max(self.token, token)

    def reset(self, token: int) -> None:
        """The writer restarted (a new epoch): forget what was typing."""
        self._rooms.clear()
        self.token = token

    def changed(self, room_ids: Sequence[str], since: int) -> dict[str, list[str]]:
        """Rooms of ``room_ids`` whose list changed after ``since``, with the list."""
        result = {}
        for room_id in room_ids:
            entry = self._rooms.get(room_id)
            if entry is not None and (entry[0] > since or since > self.token):
                result[room_id] = entry[1]
        return result


class Cancellable(Protocol):
    def cancel(self) -> None: ...


#: Runs a callback after a delay in seconds (``loop.call_later``'s shape).
CallLater = Callable[[float, Callable[[], None]], Cancellable]


def _loop_call_later(delay: float, callback: Callable[[], None]) -> Cancellable:
    return asyncio.get_running_loop().call_later(delay, callback)


class TypingWriter:
    """Typing on the writer of the ``typing`` stream. ``append`` adds rows to the
    in-memory stream (and announces them); returns their token.

    Invariant: while anyone is typing, one timer is pending, due at the earliest expiry
    (by ``clock``); when it fires every user whose expiry has passed is dropped (a row
    per room that changed) and the next timer is set. ``clock`` and ``call_later`` are
    the event loop's in production (``time.monotonic`` is the loop's clock); tests pass
    a fake pair to drive time."""

    def __init__(
        self,
        state: TypingState,
        append: Callable[[list[tuple[str, list[str]]]], int],
        clock: Callable[[], float] = time.monotonic,
        call_later: CallLater = _loop_call_later,
    ) -> None:
        self.state = state
        self._append = append
        self._clock = clock
        self._call_later = call_later
        self._expiries: dict[str, dict[str, float]] = {}
        self._timer: Cancellable | None = None

    def set_typing(self, room_id: str, user_id: str, typing: bool, timeout_ms: int) -> None:
        """Start (for ``timeout_ms``, at most :data:`MAX_TYPING_TIMEOUT_MS`; 0 is no
        time at all, so a stop) or stop the user's typing in the room."""
        room = self._expiries.setdefault(room_id, {})
        before = sorted(room)
        if typing and timeout_ms > 0:
            room[user_id] = self._clock() + min(timeout_ms, MAX_TYPING_TIMEOUT_MS) / 1000
        else:
            room.pop(user_id, None)
        if sorted(room) != before:
            self._publish(room_id)
        self._schedule()

    def _publish(self, room_id: str) -> None:
        users = sorted(self._expiries.get(room_id, {}))
        if not users:
            self._expiries.pop(room_id, None)
        token = self._append([(room_id, users)])
        self.state.apply(token, room_id, users)

    def expire(self) -> None:
        """Drop every user whose timeout has passed (called by the timer)."""
        now = self._clock()
        try:
            for room_id in list(self._expiries):
                room = self._expiries[room_id]
                gone = [u for u, expiry in room.items() if expiry <= now]
                for user_id in gone:
                    del room[user_id]
                if gone:
                    self._publish(room_id)
        finally:
            # Even if publishing failed: without a next timer nobody would expire again.
            self._schedule()

    def _schedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        expiries = [e for room in self._expiries.values() for e in room.values()]
        if expiries:
            delay = max(0.0, min(expiries) - self._clock())
            with contextlib.suppress(RuntimeError):  # no running loop: expire() by hand
                self._timer = self._call_later(delay, self.expire)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
