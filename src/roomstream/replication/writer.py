"""The writer side of replication: announce every row this instance writes, in order.

For each stream the local instance writes, a :class:`StreamBroadcaster` keeps
``last_sent``, the token up to which everything has been broadcast. The ID generator's
position listener (called only after the position is stored in the database) wakes a
sender task that reads the rows in ``(last_sent, stored position]`` with ``get_updates``,
page by page, and hands every connection:

- one ``RDATA`` per row, ``batch`` for every row of a token but the last;
- then ``POSITION(prev, new)`` when the position moved past the last row sent
  (``prev`` is the last token sent, ``new`` the page's upper bound): nothing was written
  in between.

Bursts coalesce: a sender that wakes reads up to the newest stored position at once.

Invariants:

- ``last_sent`` only grows and never exceeds the stored position, so every token
  announced is one at which all of this writer's facts had completed;
- each outbound connection receives, after it was added, the rows of consecutive
  ranges ``(a, b]``, each complete, in increasing order; a connection that cannot take
  more is closed (TCP) rather than skipped, so a reader never sees a hole on a live
  connection.

The answer to ``REPLICATE`` is a ``POSITION(stream, me, S, S)`` per stream written, ``S``
being the stored position: a reader behind ``S`` fetches the difference itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from roomstream.replication.commands import (
    Command,
    LineTooLongError,
    PositionCommand,
    RdataCommand,
)
from roomstream.streams import STREAMS, InMemoryStream, StreamSet
from roomstream.streams.registry import Update

__all__ = ["Outbound", "StreamBroadcaster", "send_all", "updates_to_commands"]

logger = logging.getLogger(__name__)

#: Rows read per ``get_updates`` call by a sender.
DEFAULT_PAGE_LIMIT = 500


class Outbound(Protocol):
    """A destination for broadcast commands (a TCP connection, or the Redis channel)."""

    def send_commands(self, commands: Sequence[Command]) -> None:
        """Queue commands in order; may close the destination (congestion) instead."""

    async def drain(self) -> None:
        """Wait until the destination can take more (Redis); return at once otherwise."""


def updates_to_commands(
    stream_name: str, writer: str, updates: Sequence[Update], prev: int, new_upto: int
) -> list[Command]:
    """RDATA for ``updates`` (complete tokens in ``(prev, new_upto]``), then a POSITION
    from the last token sent to ``new_upto`` if the range extends past the last row."""
    commands: list[Command] = []
    n = len(updates)
    last = prev
    for i, (token, row) in enumerate(updates):
        more = i + 1 < n and updates[i + 1][0] == token
        commands.append(RdataCommand(stream_name, writer, None if more else token, row))
        last = token
    if new_upto > last:
        commands.append(PositionCommand(stream_name, writer, last, new_upto))
    return commands


def send_all(commands: Sequence[Command], send: Callable[[Command], object]) -> int:
    """``send`` every command in order, never losing a row to the line-length limit.

    An RDATA whose line is too long for the transport (``send`` raises
    ``LineTooLongError``) is not sent; neither are the remaining rows of its token. In
    their place goes ``POSITION s w t t``: a reader that has not processed token ``t``
    sees ``prev`` beyond its position and fetches the token out of band (and drops the
    token's batch rows it already holds). Returns the number of tokens so replaced.
    """
    replaced = 0
    skipping = False
    for cmd in commands:
        if skipping:
            if type(cmd) is RdataCommand:
                if cmd.token is None:
                    continue
                send(PositionCommand(cmd.stream_name, cmd.instance_name, cmd.token, cmd.token))
                skipping = False
                continue
            skipping = False  # a writer never ends a page inside a token; be safe
        try:
            send(cmd)
        except LineTooLongError as exc:
            if type(cmd) is not RdataCommand:
                raise
            replaced += 1
            logger.warning(
                "%s row at %s of %s not sent (%s): readers fetch it instead",
                cmd.stream_name,
                "the next token" if cmd.token is None else f"token {cmd.token}",
                cmd.instance_name,
                exc,
            )
            if cmd.token is None:
                skipping = True
            else:
                send(PositionCommand(cmd.stream_name, cmd.instance_name, cmd.token, cmd.token))
    return replaced


@dataclass
class _Sender:
    stream_name: str
    last_sent: int
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class StreamBroadcaster:
    """Sends this instance's stream rows to every registered :class:`Outbound`.

    ``streams`` are the table-backed streams (only those this instance writes are sent);
    ``memory`` the in-memory streams it writes (typing), keyed by name; call
    :meth:`notify` after appending to one of them.
    """

    def __init__(
        self,
        streams: StreamSet,
        instance_name: str,
        memory: Mapping[str, InMemoryStream] | None = None,
        *,
        page_limit: int = DEFAULT_PAGE_LIMIT,
    ) -> None:
        self._streams = streams
        self.instance_name = instance_name
        self._memory = dict(memory or {})
        self._page_limit = page_limit
        self._outbounds: list[Outbound] = []
        self._senders: dict[str, _Sender] = {}
        self._always_fetch = False
        for name in streams.names:
            if streams.generator(name).is_writer():
                self._senders[name] = _Sender(name, self.stored_token(name))
        for name in self._memory:
            self._senders[name] = _Sender(name, self.stored_token(name))
        self._started = False

    # -- positions ----------------------------------------------------------------------

    @property
    def stream_names(self) -> list[str]:
        """The streams this instance writes, in name order."""
        return sorted(self._senders)

    def stored_token(self, stream_name: str) -> int:
        """This writer's announced-safe token: the stored position as a positive token."""
        memory = self._memory.get(stream_name)
        if memory is not None:
            return memory.token
        position = self._streams.generator(stream_name).get_stored_position()
        return -position if STREAMS[stream_name].negative else position

    def last_sent(self, stream_name: str) -> int:
        return self._senders[stream_name].last_sent

    def positions(self) -> list[PositionCommand]:
        """The answer to REPLICATE: ``POSITION s me S S`` for every stream written."""
        return [
            PositionCommand(name, self.instance_name, token, token)
            for name in self.stream_names
            for token in (self.stored_token(name),)
        ]

    # -- outbounds ----------------------------------------------------------------------

    def add_outbound(self, outbound: Outbound, *, always: bool = False) -> None:
        """Start broadcasting to ``outbound``; ``always`` marks a destination that exists
        even when nobody listens (Redis), so rows are always read and published."""
        self._outbounds.append(outbound)
        self._always_fetch = self._always_fetch or always

    def remove_outbound(self, outbound: Outbound) -> None:
        with contextlib.suppress(ValueError):
            self._outbounds.remove(outbound)

    @property
    def outbounds(self) -> list[Outbound]:
        return list(self._outbounds)

    # -- running ------------------------------------------------------------------------

    def start(self) -> None:
        """Listen to the generators and start one sender task per stream written."""
        if self._started:
            return
        self._started = True
        for name, sender in self._senders.items():
            if name not in self._memory:
                self._streams.generator(name).add_position_listener(self._on_position)
            sender.task = asyncio.create_task(self._run(sender), name=f"replication-send-{name}")
            sender.wake.set()

    async def stop(self) -> None:
        tasks = [s.task for s in self._senders.values() if s.task is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def notify(self, stream_name: str) -> None:
        """The stream's position moved (in-memory streams call this after ``append``)."""
        sender = self._senders.get(stream_name)
        if sender is not None:
            sender.wake.set()

    def _on_position(self, writer: str, position: int) -> None:
        # Generators call listeners with their own stream; find it by identity of writer.
        for name, sender in self._senders.items():
            if name in self._memory:
                continue
            token = self.stored_token(name)
            if token > sender.last_sent:
                sender.wake.set()

    async def _run(self, sender: _Sender) -> None:
        while True:
            await sender.wake.wait()
            sender.wake.clear()
            try:
                await self._send_pending(sender)
            except asyncio.CancelledError:
                raise
            except Exception:
                # A failed read leaves last_sent where it was: the next wake retries.
                logger.exception("replication sender for %s failed", sender.stream_name)
                await asyncio.sleep(0.5)
                sender.wake.set()

    async def _send_pending(self, sender: _Sender) -> None:
        name = sender.stream_name
        while True:
            target = self.stored_token(name)
            if target <= sender.last_sent:
                return
            if not self._outbounds and not self._always_fetch:
                # Nobody to tell; whoever connects later asks with REPLICATE.
                sender.last_sent = target
                return
            prev = sender.last_sent
            updates, new_upto, _ = await self._fetch(name, prev, target)
            new_upto = min(new_upto, target)
            commands = updates_to_commands(name, self.instance_name, updates, prev, new_upto)
            # No await between broadcasting a page and recording it as sent.
            for outbound in list(self._outbounds):
                outbound.send_commands(commands)
            sender.last_sent = new_upto
            for outbound in list(self._outbounds):
                await outbound.drain()

    async def _fetch(self, name: str, from_token: int, upto: int) -> tuple[list[Update], int, bool]:
        return await self.fetch_page(name, from_token, upto, self._page_limit)

    async def fetch_page(
        self, name: str, from_token: int, upto: int, limit: int
    ) -> tuple[list[Update], int, bool]:
        """This instance's rows of ``name`` in ``(from_token, upto]`` (``get_updates``
        contract: complete tokens, at most about ``limit`` rows). ``StreamTooOldError``
        when an in-memory stream no longer holds them."""
        memory = self._memory.get(name)
        if memory is not None:
            return memory.get_updates(from_token, upto, limit)
        return await self._streams.get_updates(name, self.instance_name, from_token, upto, limit)
