"""A :class:`StreamFollower` with recording callbacks, and the commands a writer sends it."""

from __future__ import annotations

from typing import Any

from roomstream.replication.commands import (
    PositionCommand,
    RdataCommand,
)
from roomstream.replication.follower import StreamFollower


class Callbacks:
    def __init__(self) -> None:
        self.processed: list[tuple[str, str, int, list[Any]]] = []
        self.moves: list[tuple[str, str, int]] = []

    def process(self, stream_name: str, writer: str, token: int, rows: list[Any]) -> None:
        self.processed.append((stream_name, writer, token, rows))

    def advanced(self, stream_name: str, writer: str, token: int) -> None:
        self.moves.append((stream_name, writer, token))


def follower(
    start: dict[tuple[str, str], int] | None = None, **kw: Any
) -> tuple[StreamFollower, Callbacks]:
    calls = Callbacks()
    return StreamFollower(calls, ["events", "typing"], start, instance_name="me", **kw), calls


def rdata(token: int | None, row: Any, writer: str = "w1", stream: str = "events") -> RdataCommand:
    return RdataCommand(stream, writer, token, row)


def position(prev: int, new: int, writer: str = "w1", stream: str = "events") -> PositionCommand:
    return PositionCommand(stream, writer, prev, new)
