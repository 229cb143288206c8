"""Replication over Redis pub/sub: every process publishes and every process listens.

As in Synapse, all processes of one homeserver share one channel named after the server
name (``server_name``); each message is one command line without its ``\\n``. Direction
rules are permissive (anyone may send anything the codec knows), a process ignores
``RDATA``/``POSITION`` about its own writes, and every process answers ``REPLICATE`` with
the positions of the streams it writes.

Each (re)subscription is a new follower session: once Redis confirms the subscription the
process publishes ``REPLICATE`` (and its own positions, in case others missed them), and
ignores rows of a stream until that stream's ``POSITION`` arrives, so a resubscribe after
Redis dropped a slow subscriber catches up through ``get_updates``.

``USER_IP`` goes on a second channel, ``<server_name>/USER_IP``, as in Synapse (which
keeps that chatty command away from processes that do not store client IPs); a process
subscribes to it when ``receive_user_ip`` is set.

Lines: Synapse limits lines to 16 KiB on TCP only; over Redis it publishes lines of any
length (a long account-data type or presence status makes RDATA lines of 24 KB, 120 KB).
Here both directions accept lines up to ``MAX_REDIS_LINE_LENGTH`` (16 MiB), far above
anything a stream row holds; a row beyond even that is announced by position instead
(:func:`~roomstream.replication.writer.send_all`), so readers fetch it.

Invariants:

- commands this process publishes reach their channel in the order they were queued; a
  failed publish is retried (duplicates are harmless: readers drop tokens they have);
- the publish queue holds at most ``max_outbound_lines`` lines before the broadcaster
  waits (it reads rows by position, so waiting delays announcements but loses nothing);
- messages are handled strictly in order; a gap is filled before the next message;
- a message that does not parse is never skipped silently: it may have been a row, so the
  process starts a new follower session (``REPLICATE``, then catch-up by position), as
  after a resubscription;
- a lost connection is known at once: redis-py's own retries (ten reconnects over about
  4 s, during which the subscription looked alive while nothing was delivered) are off,
  so the first error ends the subscription (``subscribed`` cleared, session closed) or
  marks publishing as failing, and this module's loops reconnect with their back-off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from roomstream.errors import MatrixError
from roomstream.replication.commands import (
    Command,
    PositionCommand,
    ProtocolError,
    RdataCommand,
    ReplicateCommand,
    UserIpCommand,
    parse_line,
    serialize,
)
from roomstream.replication.follower import (
    FetchUpdates,
    FollowerSession,
    StreamFollower,
    fill_gap,
)
from roomstream.replication.writer import StreamBroadcaster, send_all

__all__ = ["MAX_REDIS_LINE_LENGTH", "RedisReplication", "channel_name", "user_ip_channel_name"]

logger = logging.getLogger(__name__)

#: Lines published per pipeline round trip.
PUBLISH_BATCH = 1000
#: Longest line (bytes, without a newline) published or accepted over Redis. Synapse has
#: no limit there; this one only guards memory against a broken or hostile peer.
MAX_REDIS_LINE_LENGTH = 16 * 1024 * 1024


def _no_retries() -> Retry:
    """redis-py retries nothing: every connection error reaches this module's loops."""
    return Retry(NoBackoff(), 0, supported_errors=())


def channel_name(server_name: str) -> str:
    """The pub/sub channel of a homeserver: its server name, as Synapse names it."""
    return server_name


def user_ip_channel_name(server_name: str) -> str:
    """The channel ``USER_IP`` travels on: ``<server_name>/USER_IP``, as in Synapse."""
    return f"{channel_name(server_name)}/USER_IP"


class RedisReplication:
    """One process's Redis replication link; also the broadcaster's ``Outbound``."""

    def __init__(
        self,
        *,
        server_name: str,
        instance_name: str,
        host: str = "127.0.0.1",
        port: int = 6379,
        db: int = 0,
        url: str | None = None,
        follower: StreamFollower | None = None,
        fetch: FetchUpdates | None = None,
        broadcaster: StreamBroadcaster | None = None,
        max_outbound_lines: int = 10_000,
        on_command: Callable[[Command], None] | None = None,
        after_batch: Callable[[], None] | None = None,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
        fetch_limit: int = 1000,
        receive_user_ip: bool = True,
        max_line_length: int = MAX_REDIS_LINE_LENGTH,
    ) -> None:
        if follower is not None and fetch is None:
            raise ValueError("a follower needs a fetch function")
        self.server_name = server_name
        self.instance_name = instance_name
        self.channel = channel_name(server_name)
        self.user_ip_channel = user_ip_channel_name(server_name)
        self.receive_user_ip = receive_user_ip
        self.max_line_length = max_line_length
        self._connect_kwargs: dict[str, Any] = {
            "host": host,
            "port": port,
            "db": db,
            "retry": _no_retries(),
        }
        self._url = url
        self.follower = follower
        self._fetch = fetch
        self.broadcaster = broadcaster
        self.max_outbound_lines = max_outbound_lines
        self.on_command = on_command
        self._after_batch = after_batch
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self.fetch_limit = fetch_limit
        self._queue: deque[tuple[str, bytes]] = deque()  # (channel, line without \n)
        self._wake = asyncio.Event()
        self._space = asyncio.Event()
        self._space.set()
        self._publisher: aioredis.Redis | None = None
        self._subscriber: aioredis.Redis | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._confirmed = False
        self.subscribed = asyncio.Event()
        self.positioned = asyncio.Event()
        self.subscriptions = 0
        #: Messages that did not parse (each one started a new session and catch-up).
        self.unparseable = 0
        self.session: FollowerSession | None = None
        #: The last publish failed (cleared by the next one that succeeds).
        self.publish_failing = False

    def _client(self) -> aioredis.Redis:
        if self._url is not None:
            return aioredis.Redis.from_url(self._url, retry=_no_retries())
        return aioredis.Redis(**self._connect_kwargs)

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        self._publisher = self._client()
        if self.broadcaster is not None:
            self.broadcaster.add_outbound(self, always=True)
        self._tasks.append(asyncio.create_task(self._publish_loop(), name="redis-publish"))
        self._tasks.append(asyncio.create_task(self._subscribe_loop(), name="redis-subscribe"))

    async def stop(self) -> None:
        # The flag (and the wake-up) end the loops even when a cancellation is lost: a
        # CancelledError delivered inside a redis-py call can come back as a RedisError,
        # which the publish loop retries (a test teardown hung on it).
        self._stopping = True
        self._wake.set()
        if self.broadcaster is not None:
            self.broadcaster.remove_outbound(self)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, RedisError):
                await task
        for client in (self._subscriber, self._publisher):
            if client is not None:
                with contextlib.suppress(RedisError, OSError):
                    await client.aclose()

    async def disconnect(self) -> None:
        """Drop the subscription (it resubscribes and catches up); for tests."""
        if self._subscriber is not None:
            with contextlib.suppress(RedisError, OSError):
                await self._subscriber.connection_pool.disconnect()

    # -- publishing (Outbound) ----------------------------------------------------------

    def _enqueue(self, cmd: Command) -> None:
        line = serialize(cmd, max_line_length=self.max_line_length)[:-1]
        channel = self.user_ip_channel if type(cmd) is UserIpCommand else self.channel
        self._queue.append((channel, line))

    def send(self, cmd: Command) -> None:
        """Queue one command for its channel."""
        self._enqueue(cmd)
        self._wake.set()
        if len(self._queue) >= self.max_outbound_lines:
            self._space.clear()

    def send_commands(self, commands: Sequence[Command]) -> None:
        send_all(commands, self._enqueue)
        self._wake.set()
        if len(self._queue) >= self.max_outbound_lines:
            self._space.clear()

    async def drain(self) -> None:
        while len(self._queue) >= self.max_outbound_lines:
            self._space.clear()
            await self._space.wait()

    @property
    def queued(self) -> int:
        return len(self._queue)

    async def _publish_loop(self) -> None:
        failures = 0
        while not self._stopping:
            await self._wake.wait()
            self._wake.clear()
            while self._queue and not self._stopping:
                batch = [self._queue[i] for i in range(min(PUBLISH_BATCH, len(self._queue)))]
                try:
                    await self._publish(batch)
                except (RedisError, OSError) as exc:
                    self.publish_failing = True
                    failures += 1
                    delay = self._delay(failures)
                    logger.warning("redis publish failed (%s); retry in %.2fs", exc, delay)
                    await asyncio.sleep(delay)
                    continue
                failures = 0
                self.publish_failing = False
                for _ in batch:
                    self._queue.popleft()
                if len(self._queue) < self.max_outbound_lines:
                    self._space.set()

    async def _publish(self, batch: list[tuple[str, bytes]]) -> None:
        assert self._publisher is not None
        if len(batch) == 1:
            await self._publisher.publish(*batch[0])
            return
        pipe = self._publisher.pipeline(transaction=False)
        for channel, line in batch:
            pipe.publish(channel, line)
        await pipe.execute()

    def _delay(self, failures: int) -> float:
        base = min(self._backoff_max, self._backoff_initial * 2 ** max(0, failures - 1))
        return float(base * random.uniform(0.5, 1.0))

    # -- subscribing --------------------------------------------------------------------

    async def _subscribe_loop(self) -> None:
        failures = 0
        while not self._stopping:
            try:
                await self._subscribe_once()
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as exc:
                logger.info("redis subscription lost: %s", exc)
            except MatrixError as exc:  # a catch-up fetch over HTTP failed (writer down)
                logger.warning("redis: catching up failed (%s); resubscribing", exc)
            except Exception:
                logger.exception("redis subscription failed")
            finally:
                self._subscription_lost()
            failures = 1 if self._confirmed else failures + 1
            self._confirmed = False
            await asyncio.sleep(self._delay(failures))

    def _subscription_lost(self) -> None:
        self.subscribed.clear()
        self.positioned.clear()
        if self.session is not None:
            self.session.closed = True

    def live(self, stream_name: str, writer: str) -> bool:
        """Rows of ``(stream, writer)`` arrive as written: the subscription is confirmed,
        no error has ended it since, and the follower session is live
        (:meth:`~roomstream.replication.follower.FollowerSession.is_live`)."""
        session = self.session
        return (
            self.subscribed.is_set()
            and session is not None
            and session.is_live(stream_name, writer)
        )

    async def _subscribe_once(self) -> None:
        client = self._subscriber = self._client()
        try:
            pubsub = client.pubsub()
            channels = [self.channel]
            if self.receive_user_ip:
                channels.append(self.user_ip_channel)
            await pubsub.subscribe(*channels)
            async for message in pubsub.listen():
                kind = message.get("type")
                if kind == "subscribe":
                    # Only once every channel is confirmed (the confirmation carries the
                    # number of channels subscribed; redis-py resubscribes them all after
                    # a reconnect): REPLICATE's answers must not be missed, and Synapse
                    # waits for its SUBSCRIBE the same way.
                    if message.get("data") == len(channels):
                        self._on_subscribed()
                elif kind == "message":
                    await self._on_message(message["data"])
        finally:
            # Known lost before closing (which may itself wait on the broken connection).
            self._subscription_lost()
            with contextlib.suppress(RedisError, OSError):
                await client.aclose()

    def _on_subscribed(self) -> None:
        self.subscriptions += 1
        self._confirmed = True
        self.session = self.follower.new_session() if self.follower is not None else None
        self.subscribed.set()
        self.send(ReplicateCommand())
        if self.broadcaster is not None:
            # Others may have missed our positions while we were away.
            self.send_commands(self.broadcaster.positions())

    def _resync(self, reason: str) -> None:
        """A message did not parse. It may have been a row: start a new follower session
        and ask for positions, so any row it held is fetched by the gap rule."""
        self.unparseable += 1
        logger.warning(
            "redis: a message did not parse (%s); catching up from positions in case it was a row",
            reason,
        )
        if self.session is not None:
            self.session.closed = True
        self.session = self.follower.new_session() if self.follower is not None else None
        self.send(ReplicateCommand())

    async def _on_message(self, data: bytes | str) -> None:
        if not data.strip():
            return  # blank, as Synapse ignores them too
        try:
            cmd = parse_line(data, max_line_length=self.max_line_length)
        except ProtocolError as exc:
            self._resync(exc.reason)
            return
        cls = type(cmd)
        session = self.session
        if cls is RdataCommand or cls is PositionCommand:
            if session is None:
                return
            gap = session.handle(cmd)
            if cls is PositionCommand and not self.positioned.is_set():
                assert isinstance(cmd, PositionCommand)
                if cmd.instance_name != self.instance_name:
                    self.positioned.set()
            if gap is not None:
                assert self._fetch is not None
                await fill_gap(session, gap, self._fetch, limit=self.fetch_limit)
            if self._after_batch is not None:
                self._after_batch()
            return
        if cls is ReplicateCommand:
            if self.broadcaster is not None:
                self.send_commands(self.broadcaster.positions())
            return
        if self.on_command is not None:
            self.on_command(cmd)
