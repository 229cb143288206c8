"""Streams held in memory by their single writer (typing notifications).

They have no table: a reader that falls behind asks the writer for the rows it missed,
and a writer that restarts starts its tokens again from its new epoch.
"""

from __future__ import annotations

from collections import deque

from roomstream.streams.registry import StreamRow, Update


class StreamTooOldError(LookupError):
    """The rows asked for are older than what the writer still holds; the reader must reset."""


class InMemoryStream:
    """The last ``retained`` updates of a stream, with increasing tokens.

    Invariant: ``updates`` holds every update with a token in ``(oldest_token, token]``.
    """

    def __init__(self, name: str, retained: int = 10_000, start_token: int = 0) -> None:
        self.name = name
        self._updates: deque[Update] = deque(maxlen=retained)
        self._token = start_token
        self._oldest = start_token

    @property
    def token(self) -> int:
        return self._token

    def append(self, rows: list[StreamRow]) -> int:
        """Add rows under one new token; returns the token."""
        self._token += 1
        for row in rows:
            if len(self._updates) == self._updates.maxlen:
                self._oldest = self._updates[0][0]
            self._updates.append((self._token, row))
        return self._token

    def get_updates(
        self, from_token: int, upto_token: int, limit: int
    ) -> tuple[list[Update], int, bool]:
        """Same contract as the table-backed ``get_updates``."""
        if from_token < self._oldest:
            raise StreamTooOldError(
                f"{self.name}: token {from_token} is older than the oldest held ({self._oldest})"
            )
        upto_token = min(upto_token, self._token)
        selected = [u for u in self._updates if from_token < u[0] <= upto_token]
        if len(selected) <= limit:
            return selected, upto_token, False
        cap = selected[limit][0] - 1
        if cap <= from_token:
            cap = selected[limit][0]
        return [u for u in selected if u[0] <= cap], cap, cap < upto_token
