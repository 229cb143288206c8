"""The federation sender: local events and EDUs to the other servers in their rooms.

A :class:`FederationSender` runs in each instance named by ``federation_sender_instances``
(the default: ``main``), and handles the destinations :func:`sender_for` assigns to it (a
stable hash of the server name, as events writers are assigned rooms). It follows
streams the way any reader does, from positions of its own stored in
``federation_stream_position`` (:mod:`.catchup`), and feeds one
:class:`~.destination_queue.DestinationQueue` per destination; one task per destination
performs the queue's steps through the injected :class:`TransactionTransport`
(fedtransport's ``FederationClient`` in a process; a recording fake in tests).

- **events** (up to the stream's linear position, every writer's rows merged in token
  order, so each destination receives stream order): an ``ev`` row is sent when the event
  is local (its sender is on this server), not an outlier, not rejected and not soft
  failed. Its destinations are the servers with a joined member in the state *before* the
  event (so a server whose last member is kicked still hears of it), plus the invitee's
  server when a leave by someone else rescinds an invite or a knock (as Synapse), minus
  this server. The destinations' ``destination_rooms`` rows and the new position are
  stored in one transaction before the PDUs are queued (see :mod:`.catchup` for why that
  makes restarts exact).
- **typing** (rows heard from its writer, :meth:`on_replicated_rows`): an ``m.typing`` EDU
  per local user who started or stopped typing, to the room's joined servers.
- **receipts**: ``m.receipt`` for a local user's public receipt, to the room's servers.
- **presence**: ``m.presence`` for a local user, to every server sharing a room with them.
- **device_lists**: ``m.device_list_update`` per device of a local user whose list
  changed (empty ``prev_id``: the receiver resyncs), to the servers sharing a room.
- **to_device**: rows of ``device_federation_outbox`` (its ``messages_json`` is the
  ``m.direct_to_device`` EDU content), to their destination; durable in the queue.

EDU stream positions are stored once their EDUs are queued: typing, receipts, presence
and device lists are volatile in the protocol (Synapse keeps them in memory too), so a
stop may lose those not yet sent. To-device messages are not: each destination's
accepted position is stored (:data:`.catchup.TO_DEVICE_ACCEPTED`) and what it has not
accepted is queued again at start-up.

Replication: after storing an ``events`` position, a sender other than ``main`` says
``FEDERATION_ACK <instance> <position>`` towards ``main``; ``REMOTE_SERVER_UP <server>``
heard from any process resets that destination's back-off and retries at once, and a
destination that answers again after failing is announced with ``REMOTE_SERVER_UP``.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from roomstream import exactjson
from roomstream.client.presence import UserPresence
from roomstream.config import Config
from roomstream.e2e.device_keys_store import device_keys_of_txn
from roomstream.events.model import Event
from roomstream.federation.catchup import FederationSenderStore
from roomstream.federation.destination_queue import (
    BackoffPolicy,
    DestinationQueue,
    Edu,
    LoadCatchUp,
    PlannedTransaction,
    QueuedPdu,
    Wait,
)
from roomstream.replication.commands import (
    Command,
    FederationAckCommand,
    RemoteServerUpCommand,
)
from roomstream.replication.sharding import shard_for
from roomstream.rooms.engine import RoomEngine
from roomstream.rooms.store import chunks, placeholders
from roomstream.state.groups import get_state_txn
from roomstream.storage import Transaction
from roomstream.streams.rows import (
    DeviceListsRow,
    EventRow,
    PresenceRow,
    ReceiptsRow,
    TypingRow,
    events_row_from_wire,
)

__all__ = [
    "FederationSender",
    "SendCommand",
    "TransactionTransport",
    "is_federation_sender",
    "sender_for",
    "server_of",
]

logger = logging.getLogger(__name__)

#: Seconds before a stream range whose handling failed (database error) is read again.
RETRY_READ_AFTER_S = 1.0
#: Tokens of a stream read per batch (bounds a batch after a long stop).
BATCH_TOKENS = 1000
#: State groups whose joined servers are remembered.
HOSTS_CACHE_SIZE = 1000
#: Receipt types other servers are told of (private ones stay here).
PUBLIC_RECEIPT_TYPES = frozenset({"m.read"})
#: Stream consumed for EDUs, and the name its position is stored under.
EDU_STREAMS = ("receipts", "presence", "to_device", "device_lists")


class TransactionTransport(Protocol):
    """Sends one transaction (fed_shared.md: ``FederationClient.send_transaction``).

    Raises on failure. An exception with an integer ``status`` attribute in 400..499
    (other than 429) means the destination refused the transaction itself: it is not
    retried. Anything else (unreachable, timed out, 5xx, 429) is a failure to back off
    from."""

    async def send_transaction(
        self, destination: str, txn_id: str, body: Mapping[str, Any]
    ) -> Mapping[str, Any]: ...


SendCommand = Callable[[Command, str], bool]
"""``ReplicationNode.send_command``: a client command towards an instance."""


def server_of(user_id: str) -> str:
    """The server part of a user ID (``@a:example.org:8448`` -> ``example.org:8448``)."""
    return user_id.split(":", 1)[1] if ":" in user_id else ""


def sender_for(destination: str, instances: Sequence[str]) -> str:
    """The sender instance (of ``federation_sender_instances``) that sends to
    ``destination``: the same in every process (SHA-256, not Python's salted hash)."""
    return instances[shard_for(destination, len(instances))]


def is_federation_sender(config: Config) -> bool:
    """Whether ``config``'s instance runs a :class:`FederationSender`."""
    return config.instance_name in config.federation_sender_instances


class FederationSender:
    """Sends this server's events and EDUs to other servers (see the module docstring).

    The assembly passes the engine (database, streams, event store), the configuration,
    the transport and replication's ``send_command``; it adds the sender to
    ``node.listeners`` (typing rows, replicated positions) and its :meth:`on_command` to
    ``node.command_listeners`` (``REMOTE_SERVER_UP``), and calls :meth:`on_replicated_rows`
    with the typing rows this process writes itself. ``clock`` (seconds) and ``jitter``
    are injected for tests.
    """

    def __init__(
        self,
        engine: RoomEngine,
        config: Config,
        transport: TransactionTransport,
        *,
        send_command: SendCommand | None = None,
        clock: Callable[[], float] = time.time,
        jitter: Callable[[], float] = lambda: random.uniform(0.8, 1.4),
    ) -> None:
        self.engine = engine
        self.config = config
        self.transport = transport
        self.send_command = send_command
        self.clock = clock
        self.jitter = jitter
        self.server_name = engine.server_name
        self.instance_name = config.instance_name
        self.instances = config.federation_sender_instances
        self.policy = BackoffPolicy(scale=config.federation_sender.retry_interval_scale)
        self.store = FederationSenderStore(engine.db)
        self.queues: dict[str, DestinationQueue] = {}
        self._wakes: dict[str, asyncio.Event] = {}
        self._drivers: dict[str, asyncio.Task[None]] = {}
        self._followers: list[asyncio.Task[None]] = []
        self._stream_wakes: dict[str, asyncio.Event] = {}
        self._positions: dict[str, int] = {}
        self._typing: dict[str, frozenset[str]] = {}
        self._typing_lock = asyncio.Lock()
        #: Local user -> the device IDs last announced (to announce deletions).
        self._devices_seen: dict[str, set[str]] = {}
        self._edu_tasks: set[asyncio.Task[None]] = set()
        self._hosts_cache: dict[int, tuple[frozenset[str], dict[str, str]]] = {}
        self._txn_epoch = 0
        self._txn_counter = 0
        self._stopping = False
        self._started = False

    # -- lifecycle -------------------------------------------------------------------------

    def handles(self, destination: str) -> bool:
        """Whether this instance sends to ``destination`` (never to this server)."""
        return destination != self.server_name and (
            sender_for(destination, self.instances) == self.instance_name
        )

    async def start(self) -> None:
        """Load positions and destinations, then follow the streams and send."""
        if self._started:
            raise RuntimeError("the federation sender is already started")
        self._started = True
        self._txn_epoch = await self.store.next_txn_epoch()
        streams = self.engine.streams
        for name in ("events", *EDU_STREAMS):
            stored = await self.store.get_position(self.instance_name, name)
            # A first start sends nothing from before it: history is not replayed.
            self._positions[name] = (
                stored if stored is not None else streams.generator(name).get_linear_position()
            )
            if stored is None:
                await self.store.set_position(self.instance_name, name, self._positions[name])
        for record in await self.store.get_destinations():
            if not self.handles(record.destination):
                continue
            queue = self._new_queue(
                record.destination, record.retry, record.last_successful_stream_ordering
            )
            if record.needs_catch_up:
                queue.start_catching_up()
                self._wake(record.destination)
        # To-device messages read before the stop and not accepted since: again.
        unsent = await self.store.get_unsent_to_device(self._positions["to_device"])
        await self._queue_to_device([m for m in unsent if self.handles(m[0])])
        for name in ("events", *EDU_STREAMS):
            wake = self._stream_wakes[name] = asyncio.Event()
            wake.set()
            generator = streams.generator(name)
            if generator.is_writer():
                generator.add_position_listener(lambda *_a, w=wake: w.set())
            self._followers.append(asyncio.create_task(self._follow(name)))

    async def stop(self) -> None:
        """Stop following and sending. A transaction in flight is waited for (it is bounded
        by the transport's time-out), so that its outcome is recorded; what is still
        queued is caught up after the next start."""
        self._stopping = True
        for task in self._followers:
            task.cancel()
        for task in [*self._followers, *self._edu_tasks]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for wake in self._wakes.values():
            wake.set()
        for task in list(self._drivers.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # -- replication -----------------------------------------------------------------------

    def on_replicated_rows(
        self, stream_name: str, writer: str, token: int, rows: Sequence[Any]
    ) -> None:
        """Typing rows (from its writer, or this process's own): EDUs for local users."""
        del writer, token
        if stream_name != "typing" or self._stopping:
            return
        for wire in rows:
            self._spawn(self._typing_changed(TypingRow.from_wire(wire)))

    def on_replicated_position(self, stream_name: str, writer: str, position: int) -> None:
        del writer, position
        wake = self._stream_wakes.get(stream_name)
        if wake is not None:
            # Replication advances the ID generator right after telling listeners: the
            # follower reads the new linear position when it runs, after that.
            wake.set()

    def on_command(self, cmd: Command) -> None:
        """``REMOTE_SERVER_UP``: retry that destination now, without its back-off."""
        if isinstance(cmd, RemoteServerUpCommand):
            queue = self.queues.get(cmd.server_name)
            if queue is not None:
                queue.reset_backoff()
                self._wake(cmd.server_name)

    def retry_due(self) -> None:
        """Re-check every destination against the clock (tests move an injected clock)."""
        for destination in self.queues:
            self._wake(destination)

    # -- following streams -------------------------------------------------------------------

    async def _follow(self, stream_name: str) -> None:
        wake = self._stream_wakes[stream_name]
        generator = self.engine.streams.generator(stream_name)
        while not self._stopping:
            await wake.wait()
            wake.clear()
            while not self._stopping:
                start = self._positions[stream_name]
                bound = min(generator.get_linear_position(), start + BATCH_TOKENS)
                if bound <= start:
                    break
                try:
                    updates = await self._read(stream_name, start, bound)
                    await self._handle(stream_name, updates, bound)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    logger.exception("federation sender: handling %s failed", stream_name)
                    # Nothing was stored past the failure: try the same range again soon.
                    asyncio.get_running_loop().call_later(RETRY_READ_AFTER_S, wake.set)
                    break
                self._positions[stream_name] = bound

    async def _read(self, stream_name: str, start: int, bound: int) -> list[tuple[int, Any]]:
        """Every writer's rows in ``(start, bound]``, merged in token order."""
        streams = self.engine.streams
        per_writer: list[list[tuple[int, Any]]] = []
        for writer in streams.generator(stream_name).writers:
            rows: list[tuple[int, Any]] = []
            since = start
            while since < bound:
                updates, upto, limited = await streams.get_updates(
                    stream_name,
                    writer,
                    since,
                    bound,
                    10_000,
                    transaction_name="federation_sender_read",
                )
                rows.extend(updates)
                since = upto
                if not limited:
                    break
            per_writer.append(rows)
        return list(heapq.merge(*per_writer, key=lambda u: u[0]))

    async def _handle(self, stream_name: str, updates: list[tuple[int, Any]], bound: int) -> None:
        if stream_name == "events":
            await self._handle_events(updates, bound)
            return
        if stream_name == "receipts":
            await self._handle_receipts([ReceiptsRow.from_wire(r) for _, r in updates])
        elif stream_name == "presence":
            await self._handle_presence([PresenceRow.from_wire(r) for _, r in updates])
        elif stream_name == "device_lists":
            await self._handle_device_lists(
                [(t, DeviceListsRow.from_wire(r).user_id) for t, r in updates]
            )
        else:
            await self._handle_to_device(self._positions[stream_name], bound)
        await self.store.set_position(self.instance_name, stream_name, bound)

    # -- events --------------------------------------------------------------------------------

    async def _handle_events(self, updates: list[tuple[int, Any]], bound: int) -> None:
        candidates: list[tuple[int, EventRow]] = []
        for token, wire in updates:
            row = events_row_from_wire(wire)
            if isinstance(row, EventRow) and not row.rejected and not row.outlier:
                candidates.append((token, row))
        store = self.engine.store
        ids = [row.event_id for _, row in candidates]
        events = await store.get_events(ids)
        metas = await store.get_meta(ids)
        planned: list[tuple[str, QueuedPdu]] = []
        for token, row in candidates:
            event = events.get(row.event_id)
            meta = metas.get(row.event_id)
            if event is None or meta is None or meta.soft_failed:
                continue
            if server_of(event.sender) != self.server_name:
                continue  # received from elsewhere: its origin sends it
            destinations = await self._destinations_for(event.event_id, event)
            pdu = QueuedPdu(event.event_id, row.room_id, token, dict(event.data))
            planned.extend((d, pdu) for d in sorted(destinations) if self.handles(d))
        await self.store.record_events(
            self.instance_name,
            [(d, p.room_id, p.stream_ordering) for d, p in planned],
            bound,
        )
        await self._ensure_queues({d for d, _ in planned})
        for destination, pdu in planned:
            self.queues[destination].add_pdu(pdu)
            self._wake(destination)
        if self.send_command is not None and self.instance_name != "main":
            self.send_command(FederationAckCommand(self.instance_name, bound), "main")

    async def _destinations_for(self, event_id: str, event: Event) -> set[str]:
        """Servers with a joined member before the event (+ a rescinded invitee's)."""
        if not event.prev_event_ids:
            return set()
        hosts, memberships = await self._hosts_before(event_id)
        destinations = set(hosts)
        if (
            event.type == "m.room.member"
            and event.membership == "leave"
            and event.state_key is not None
            and event.sender != event.state_key
            and memberships.get(event.state_key) in ("invite", "knock")
        ):
            destinations.add(server_of(event.state_key))
        destinations.discard(self.server_name)
        return destinations

    async def _hosts_before(self, event_id: str) -> tuple[frozenset[str], dict[str, str]]:
        """(joined servers, user -> membership) in the state before the event."""
        groups = await self.engine.store.get_state_groups([event_id])
        if event_id not in groups:
            return frozenset(), {}
        group = groups[event_id][0]
        cached = self._hosts_cache.get(group)
        if cached is not None:
            return cached
        memberships = await self.engine.db.run_interaction(
            "federation_sender_members_at", _memberships_in_group_txn, group
        )
        result = (
            frozenset(server_of(u) for u, m in memberships.items() if m == "join"),
            memberships,
        )
        if len(self._hosts_cache) >= HOSTS_CACHE_SIZE:
            self._hosts_cache.pop(next(iter(self._hosts_cache)))
        self._hosts_cache[group] = result
        return result

    # -- EDUs ----------------------------------------------------------------------------------

    def _is_local(self, user_id: str) -> bool:
        return server_of(user_id) == self.server_name

    async def _joined_hosts_now(self, room_id: str) -> set[str]:
        rows = await self.engine.db.run_interaction(
            "federation_sender_joined_hosts",
            lambda t: t.query(
                "SELECT state_key FROM current_state_events WHERE room_id = ?"
                " AND type = 'm.room.member' AND membership = 'join'",
                (room_id,),
            ),
        )
        return {server_of(str(r[0])) for r in rows} - {self.server_name}

    async def _typing_changed(self, row: TypingRow) -> None:
        # One row at a time, in arrival order (asyncio's lock is first come, first
        # served, and each task asks for it before anything else): a stop queued after
        # a start must not overtake it, as the newer EDU replaces the older.
        async with self._typing_lock:
            now = frozenset(u for u in row.user_ids if self._is_local(u))
            before = self._typing.get(row.room_id, frozenset())
            self._typing[row.room_id] = now
            changes = [(u, True) for u in sorted(now - before)]
            changes += [(u, False) for u in sorted(before - now)]
            if not changes:
                return
            hosts = await self._joined_hosts_now(row.room_id)
            edus = [
                Edu(
                    "m.typing",
                    {"room_id": row.room_id, "user_id": user, "typing": typing},
                    key=("typing", row.room_id, user),
                )
                for user, typing in changes
            ]
            await self._queue_edus(hosts, edus)

    async def _handle_receipts(self, rows: Iterable[ReceiptsRow]) -> None:
        for row in rows:
            if not self._is_local(row.user_id) or row.receipt_type not in PUBLIC_RECEIPT_TYPES:
                continue
            data = dict(row.data or {})
            if row.thread_id is not None:
                data["thread_id"] = row.thread_id
            content = {
                row.room_id: {
                    row.receipt_type: {row.user_id: {"event_ids": [row.event_id], "data": data}}
                }
            }
            key = ("receipt", row.room_id, row.receipt_type, row.user_id, row.thread_id or "")
            hosts = await self._joined_hosts_now(row.room_id)
            await self._queue_edus(hosts, [Edu("m.receipt", content, key=key)])

    async def _handle_presence(self, rows: Iterable[PresenceRow]) -> None:
        now_ms = int(self.clock() * 1000)
        for row in rows:
            if not self._is_local(row.user_id):
                continue
            # The client API's own rendering of the row (the spec's m.presence entry).
            state = {"user_id": row.user_id, **UserPresence(*row).content(now_ms)}
            edu = Edu("m.presence", {"push": [state]}, key=("presence", row.user_id))
            await self._queue_edus(await self._users_hosts(row.user_id), [edu])

    async def _users_hosts(self, user_id: str) -> set[str]:
        """The servers sharing a joined room with the user."""
        hosts: set[str] = set()
        for room_id in await self.engine.store.get_rooms_for_user(user_id):
            hosts |= await self._joined_hosts_now(room_id)
        return hosts

    async def _handle_device_lists(self, changes: Sequence[tuple[int, str]]) -> None:
        """``m.device_list_update`` for each device of a local user whose list changed
        (and for each device this run saw before that is gone, ``deleted``).

        ``prev_id`` is always empty: the receiver then fetches the user's whole list
        (``/user/devices``), as Synapse's receiver does for an empty ``prev_id``. That is
        correct whatever it saw before (a restart here, a destination that was down), at
        the cost of a query per change; the ``prev_id`` chain per destination that would
        spare it is not kept."""
        newest: dict[str, int] = {}
        for token, user_id in changes:
            if self._is_local(user_id):
                newest[user_id] = max(token, newest.get(user_id, token))
        for user_id, stream_id in sorted(newest.items()):
            devices = await self.engine.db.run_interaction(
                "federation_sender_devices", _devices_of_txn, user_id
            )
            gone = self._devices_seen.get(user_id, set()) - set(devices)
            self._devices_seen[user_id] = set(devices)
            edus = []
            for device_id, (display_name, keys) in sorted(devices.items()):
                content: dict[str, Any] = {
                    "user_id": user_id,
                    "device_id": device_id,
                    "stream_id": stream_id,
                    "prev_id": [],
                    "deleted": False,
                }
                if display_name is not None:
                    content["device_display_name"] = display_name
                if keys is not None:
                    content["keys"] = keys
                edus.append(self._device_edu(content))
            for device_id in sorted(gone):
                edus.append(
                    self._device_edu(
                        {
                            "user_id": user_id,
                            "device_id": device_id,
                            "stream_id": stream_id,
                            "prev_id": [],
                            "deleted": True,
                        }
                    )
                )
            if edus:
                await self._queue_edus(await self._users_hosts(user_id), edus)

    @staticmethod
    def _device_edu(content: dict[str, Any]) -> Edu:
        key = ("device_list", content["user_id"], content["device_id"])
        return Edu("m.device_list_update", content, key=key)

    async def _handle_to_device(self, start: int, bound: int) -> None:
        rows = await self.engine.db.run_interaction(
            "federation_sender_to_device",
            lambda t: t.query(
                "SELECT destination, stream_id, messages_json FROM device_federation_outbox"
                " WHERE stream_id > ? AND stream_id <= ? ORDER BY stream_id",
                (start, bound),
            ),
        )
        messages = [(str(d), int(i), str(m)) for d, i, m in rows if self.handles(str(d))]
        first: dict[str, int] = {}
        for destination, stream_id, _ in messages:
            first.setdefault(destination, stream_id)
        if first:
            # Recorded before they are queued: a restart queues again what the
            # destination has not accepted (get_unsent_to_device).
            await self.store.note_to_device(first)
        await self._queue_to_device(messages)

    async def _queue_to_device(self, messages: Sequence[tuple[str, int, str]]) -> None:
        for destination, stream_id, messages_json in messages:
            content = exactjson.loads(messages_json)
            edu = Edu("m.direct_to_device", content, durable=True, stream_id=stream_id)
            await self._queue_edus({destination}, [edu])

    async def _queue_edus(self, hosts: Iterable[str], edus: Sequence[Edu]) -> None:
        mine = {h for h in hosts if self.handles(h)}
        await self._ensure_queues(mine)
        for host in sorted(mine):
            queue = self.queues[host]
            for edu in edus:
                queue.add_edu(edu)
            self._wake(host)

    def _spawn(self, work: Awaitable[None]) -> None:
        async def run() -> None:
            try:
                await work
            except Exception:
                logger.exception("federation sender: queueing an EDU failed")

        task = asyncio.get_running_loop().create_task(run())
        self._edu_tasks.add(task)
        task.add_done_callback(self._edu_tasks.discard)

    # -- destinations --------------------------------------------------------------------------

    def _new_queue(
        self, destination: str, retry: Any = None, last_successful: int | None = None
    ) -> DestinationQueue:
        queue = DestinationQueue(
            destination,
            self.policy,
            last_successful_stream_ordering=last_successful,
            retry=retry,
        )
        self.queues[destination] = queue
        self._wakes[destination] = asyncio.Event()
        self._drivers[destination] = asyncio.create_task(self._drive(destination))
        return queue

    async def _ensure_queues(self, destinations: Iterable[str]) -> None:
        missing = {d for d in destinations if d not in self.queues}
        if not missing:
            return
        records = {r.destination: r for r in await self.store.get_destinations(missing)}
        for destination in sorted(missing):
            if destination in self.queues:
                continue
            record = records.get(destination)
            if record is None:
                self._new_queue(destination)
            else:
                self._new_queue(destination, record.retry, record.last_successful_stream_ordering)

    def _wake(self, destination: str) -> None:
        wake = self._wakes.get(destination)
        if wake is not None:
            wake.set()

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def _next_txn_id(self) -> str:
        self._txn_counter += 1
        return f"{self._txn_epoch}.{self._txn_counter}"

    async def _drive(self, destination: str) -> None:
        """Perform the destination's steps until the sender stops."""
        queue = self.queues[destination]
        wake = self._wakes[destination]
        while not self._stopping:
            step = queue.next_step(self._now_ms())
            if isinstance(step, Wait):
                timeout = None
                if step.until is not None:
                    timeout = max(0.0, (step.until - self._now_ms()) / 1000)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), timeout)
                wake.clear()
                continue
            if isinstance(step, LoadCatchUp):
                try:
                    queue.catch_up_loaded(await self._load_catch_up(destination, step))
                except asyncio.CancelledError:
                    raise
                except Exception:
                    queue.catch_up_load_failed()
                    logger.exception("federation sender: catch-up load for %s", destination)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(wake.wait(), 1.0)
                    wake.clear()
                continue
            try:
                await self._send(queue, step)
            except asyncio.CancelledError:
                raise
            except Exception:
                # Recording the outcome failed (the queue already took it into account;
                # the next outcome's record carries it).
                logger.exception("federation sender: recording a transaction to %s", destination)

    async def _load_catch_up(self, destination: str, step: LoadCatchUp) -> list[QueuedPdu]:
        rows = await self.store.get_catch_up_rows(destination, step.after, step.limit)
        events = await self.engine.store.get_events([r.event_id for r in rows])
        return [
            QueuedPdu(r.event_id, r.room_id, r.stream_ordering, dict(events[r.event_id].data))
            for r in rows
            if r.event_id in events
        ]

    async def _send(self, queue: DestinationQueue, planned: PlannedTransaction) -> None:
        destination = queue.destination
        txn_id = self._next_txn_id()
        body = {
            "origin": self.server_name,
            "origin_server_ts": self._now_ms(),
            "pdus": [dict(p.pdu) for p in planned.pdus],
            "edus": [e.to_json(self.server_name, destination) for e in planned.edus],
        }
        try:
            response = await self.transport.send_transaction(destination, txn_id, body)
        except Exception as exc:
            status = getattr(exc, "status", None)
            if isinstance(status, int) and 400 <= status < 500 and status != 429:
                logger.warning("%s refused transaction %s: %s", destination, txn_id, exc)
                queue.on_rejected()
                await self.store.record_success(
                    destination, queue.last_successful_stream_ordering, _to_device_upto(planned)
                )
                return
            retry = queue.on_failure(self._now_ms(), self.jitter())
            logger.info(
                "transaction %s to %s failed (%s); retrying in %d ms",
                txn_id,
                destination,
                exc,
                retry.retry_interval,
            )
            await self.store.set_retry(destination, retry)
            return
        for event_id, result in dict((response or {}).get("pdus") or {}).items():
            if isinstance(result, Mapping) and "error" in result:
                logger.info("%s refused PDU %s: %s", destination, event_id, result["error"])
        was_failing = queue.on_success(self._now_ms())
        await self.store.record_success(
            destination, queue.last_successful_stream_ordering, _to_device_upto(planned)
        )
        if was_failing and self.send_command is not None:
            self.send_command(RemoteServerUpCommand(destination), "main")


def _to_device_upto(planned: PlannedTransaction) -> int | None:
    """The highest to-device stream ID a transaction carried (None: none)."""
    ids = [e.stream_id for e in planned.edus if e.stream_id is not None]
    return max(ids) if ids else None


def _memberships_in_group_txn(t: Transaction, group: int) -> dict[str, str]:
    state = get_state_txn(t, group)
    member_events = {ev: key[1] for key, ev in state.items() if key[0] == "m.room.member"}
    result: dict[str, str] = {}
    for chunk in chunks(list(member_events)):
        for event_id, membership in t.query(
            "SELECT event_id, membership FROM events"
            f" WHERE event_id IN ({placeholders(len(chunk))})",
            chunk,
        ):
            if membership is not None:
                result[member_events[str(event_id)]] = str(membership)
    return result


def _devices_of_txn(
    t: Transaction, user_id: str
) -> dict[str, tuple[str | None, dict[str, Any] | None]]:
    """device ID -> (display name, uploaded device keys or None), for the user's devices."""
    keys = device_keys_of_txn(t, user_id, None)
    return {
        str(device_id): (None if name is None else str(name), keys.get(str(device_id)))
        for device_id, name in t.query(
            "SELECT device_id, display_name FROM devices WHERE user_id = ?", (user_id,)
        )
    }


if TYPE_CHECKING:
    from roomstream.replication.worker import ReplicatedDataListener

    def _is_a_replication_listener(sender: FederationSender) -> ReplicatedDataListener:
        """Checked by mypy: the assembly can put a sender in ``node.listeners``."""
        return sender
