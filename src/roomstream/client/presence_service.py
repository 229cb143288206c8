"""Presence on each process: the state machine (:mod:`roomstream.client.presence`) runs on
the ``presence`` stream's one writer; every other process tells it what its clients do.

- On the writer, :class:`PresenceWriter` feeds the machine with this process's syncs and
  ``PUT /presence/{userId}/status`` calls, with the ``USER_SYNC`` and
  ``CLEAR_USER_SYNC`` commands other processes send over replication, and with the time
  (a timer at the machine's next deadline); the states worth telling are persisted to the
  ``presence`` stream in order (one writer task), which wakes the syncs concerned.
- Elsewhere, :class:`RemotePresence` does what Synapse's ``WorkerPresenceHandler`` does:
  a sync's ``set_presence`` is relayed to the writer over the internal API (at most once
  per relay interval while it is unchanged), a device's first sync in progress sends
  ``USER_SYNC … start``, and its last one ending sends ``USER_SYNC … end`` once it has
  stayed ended for a while (a client's next long poll usually follows at once). Every
  quarter of ``presence.process_expiry`` the devices still syncing are announced again, so
  the writer knows this process is alive; when the process stops it sends
  ``CLEAR_USER_SYNC``; when it dies without a word, the writer stops counting its syncs
  once it has been silent for ``process_expiry`` and its users time out.

Reads (``GET /presence/{userId}/status``, ``/sync``) are the stream's table's, on any
process (:class:`~roomstream.client.presence_store.PresenceStore`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from roomstream.client.presence import (
    OFFLINE,
    PresenceMachine,
    PresenceTimeouts,
    UserPresence,
)
from roomstream.client.presence_store import PresenceStore
from roomstream.errors import ForbiddenError
from roomstream.replication.commands import ClearUserSyncCommand, Command, UserSyncCommand

__all__ = ["PresenceService", "PresenceWriter", "RemotePresence", "wall_clock_ms"]

logger = logging.getLogger(__name__)


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


#: Relays a state to the writer: (user, device, presence, status_msg, is_sync).
RelayState = Callable[[str, str | None, str, str | None, bool], Awaitable[None]]
#: Sends a replication command towards the presence writer (False: not sent now).
SendCommand = Callable[[Command], object]


class PresenceWriter:
    """The machine on the ``presence`` writer (see the module docstring)."""

    def __init__(
        self,
        store: PresenceStore,
        timeouts: PresenceTimeouts,
        instance_name: str,
        clock_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.store = store
        self.instance_name = instance_name
        self._clock = clock_ms
        self.machine = PresenceMachine(timeouts)
        self._pending: dict[str, UserPresence] = {}
        self._written: asyncio.Future[None] | None = None
        self._writing: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False

    async def start(self) -> None:
        """Restore the states stored as not offline (each times out unless its user
        comes back)."""
        restored = await self.store.not_offline()
        self.machine = PresenceMachine(self.machine.config, restored, self._clock())
        self._schedule()

    # -- what clients and processes do ---------------------------------------------------

    async def set_state(
        self,
        user_id: str,
        device_id: str | None,
        presence: str,
        status_msg: str | None = None,
        *,
        is_sync: bool = False,
    ) -> None:
        changes = self.machine.set_state(
            user_id, device_id, presence, self._clock(), status_msg=status_msg, is_sync=is_sync
        )
        await self._apply(changes)

    async def sync_started(self, user_id: str, device_id: str | None, presence: str) -> None:
        await self._apply(self.machine.sync_started(user_id, device_id, presence, self._clock()))

    def sync_ended(self, user_id: str, device_id: str | None) -> None:
        self._apply_later(self.machine.sync_ended(user_id, device_id, self._clock()))

    def on_command(self, cmd: Command) -> None:
        """A replication command from another process (others are ignored)."""
        now = self._clock()
        if isinstance(cmd, UserSyncCommand):
            if cmd.instance_id == self.instance_name:
                return  # our own, echoed by Redis: this process tracks its syncs itself
            changes = self.machine.external_sync(
                cmd.instance_id,
                cmd.user_id,
                cmd.device_id,
                cmd.is_syncing,
                cmd.last_sync_ms,
                now,
            )
        elif isinstance(cmd, ClearUserSyncCommand):
            if cmd.instance_id == self.instance_name:
                return
            changes = self.machine.external_clear(cmd.instance_id, now)
        else:
            return
        self._apply_later(changes)

    # -- time and persisting -----------------------------------------------------------

    def _on_timer(self) -> None:
        self._timer = None
        try:
            self._apply_later(self.machine.timeouts(self._clock()))
        except Exception:
            logger.exception("presence timeouts failed")
            self._schedule()

    def _schedule(self) -> None:
        """A timer at the machine's next deadline (replacing the one pending)."""
        if self._closed:
            return
        deadline = self.machine.next_deadline()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if deadline is not None:
            delay = max(0.0, (deadline - self._clock()) / 1000)
            self._timer = asyncio.get_running_loop().call_later(delay, self._on_timer)

    def _apply_later(self, changes: list[UserPresence]) -> None:
        written = self._enqueue(changes)
        if written is not None:
            written.add_done_callback(_consume)

    async def _apply(self, changes: list[UserPresence]) -> None:
        written = self._enqueue(changes)
        if written is not None:
            await asyncio.shield(written)

    def _enqueue(self, changes: list[UserPresence]) -> asyncio.Future[None] | None:
        """Queue the states for the one writer task (so they are stored in the order the
        machine made them); a future done once they are. Reschedules the timer."""
        self._schedule()
        if not changes or self._closed:
            return None
        for state in changes:
            self._pending[state.user_id] = state
        if self._written is None:
            self._written = asyncio.get_running_loop().create_future()
        written = self._written
        if self._writing is None:
            self._writing = asyncio.get_running_loop().create_task(self._write())
        return written

    async def _write(self) -> None:
        try:
            while self._pending:
                batch = list(self._pending.values())
                self._pending.clear()
                done, self._written = self._written, None
                try:
                    await self.store.persist(batch)
                except Exception as exc:
                    logger.exception("storing presence failed")
                    if done is not None and not done.done():
                        done.set_exception(exc)
                    continue
                if done is not None and not done.done():
                    done.set_result(None)
        finally:
            self._writing = None

    def close(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        if self._writing is not None:
            self._writing.cancel()


def _consume(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()  # logged by the writer task


class RemotePresence:
    """A process that is not the presence writer (see the module docstring)."""

    def __init__(
        self,
        instance_name: str,
        timeouts: PresenceTimeouts,
        relay: RelayState,
        send: SendCommand,
        clock_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.instance_name = instance_name
        self._relay = relay
        self._send = send
        self._clock = clock_ms
        #: How long an ended sync waits before the writer is told (Synapse: 10 s).
        self.end_delay_ms = min(10_000, timeouts.sync_online_ms // 3)
        #: How often an unchanged sync state is relayed again.
        self.relay_interval_ms = max(1, min(timeouts.sync_online_ms, timeouts.idle_ms) // 2)
        self.keepalive_ms = max(1, timeouts.process_expiry_ms // 4)
        self._syncs: Counter[tuple[str, str | None]] = Counter()
        self._ending: dict[tuple[str, str | None], int] = {}
        self._relayed: dict[tuple[str, str | None], tuple[str, int]] = {}
        self._loop_task: asyncio.Task[None] | None = None
        self._closed = False

    def start(self) -> None:
        self._loop_task = asyncio.get_running_loop().create_task(self._loop())

    async def set_state(
        self, user_id: str, device_id: str | None, presence: str, status_msg: str | None
    ) -> None:
        self._relayed.pop((user_id, device_id), None)
        await self._relay(user_id, device_id, presence, status_msg, False)

    async def sync_started(self, user_id: str, device_id: str | None, presence: str) -> None:
        key = (user_id, device_id)
        now = self._clock()
        last = self._relayed.get(key)
        if last is None or last[0] != presence or now - last[1] >= self.relay_interval_ms:
            self._relayed[key] = (presence, now)
            try:
                await self._relay(user_id, device_id, presence, None, True)
            except Exception as exc:
                # Presence must not fail a sync: the next sync relays again.
                self._relayed.pop(key, None)
                logger.warning("relaying presence of %s failed: %s", user_id, exc)
        self._syncs[key] += 1
        if self._syncs[key] == 1 and self._ending.pop(key, None) is None:
            self._user_sync(user_id, device_id, True, now)

    def sync_ended(self, user_id: str, device_id: str | None) -> None:
        key = (user_id, device_id)
        self._syncs[key] -= 1
        if self._syncs[key] <= 0:
            del self._syncs[key]
            self._ending[key] = self._clock()

    def _user_sync(self, user_id: str, device_id: str | None, syncing: bool, when: int) -> None:
        try:
            self._send(UserSyncCommand(self.instance_name, user_id, device_id, syncing, when))
        except Exception as exc:  # a device ID the codec cannot carry: no presence for it
            logger.warning("cannot send USER_SYNC for %s: %s", user_id, exc)

    def tick(self) -> None:
        """Tell the writer of syncs that stayed ended; announce those in progress when
        a keepalive is due (called by the loop; tests call it by hand)."""
        now = self._clock()
        for key, ended in list(self._ending.items()):
            if now - ended >= self.end_delay_ms:
                del self._ending[key]
                self._relayed.pop(key, None)
                self._user_sync(key[0], key[1], False, ended)

    def keepalive(self) -> None:
        now = self._clock()
        for user_id, device_id in list(self._syncs):
            self._user_sync(user_id, device_id, True, now)

    async def _loop(self) -> None:
        step = max(0.01, min(self.end_delay_ms, self.keepalive_ms) / 1000 / 2)
        last_keepalive = self._clock()
        while True:
            await asyncio.sleep(step)
            try:
                self.tick()
                if self._clock() - last_keepalive >= self.keepalive_ms:
                    last_keepalive = self._clock()
                    self.keepalive()
            except Exception:
                logger.exception("presence bookkeeping failed")

    def close(self) -> None:
        """The process stops: its syncs are over (``CLEAR_USER_SYNC``, once)."""
        if self._loop_task is not None:
            self._loop_task.cancel()
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self._send(ClearUserSyncCommand(self.instance_name))


class PresenceService:
    """What the Client-Server API asks of presence on this process: the writer's machine
    (``writer``) or the relay to it (``remote``), and the stream's table for reads.
    ``enabled`` false (``presence.enabled``): nothing is tracked, everyone reads as
    offline (Synapse's ``presence.enabled: false``)."""

    def __init__(
        self,
        store: PresenceStore,
        *,
        writer: PresenceWriter | None = None,
        remote: RemotePresence | None = None,
        enabled: bool = True,
        clock_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.store = store
        self.writer = writer
        self.remote = remote
        self.enabled = enabled
        self._clock = clock_ms

    async def start(self) -> None:
        if self.writer is not None:
            await self.writer.start()
        if self.remote is not None:
            self.remote.start()

    async def set_status(
        self, user_id: str, device_id: str | None, presence: str, status_msg: str | None
    ) -> None:
        if not self.enabled:
            return
        if self.writer is not None:
            await self.writer.set_state(user_id, device_id, presence, status_msg)
        elif self.remote is not None:
            await self.remote.set_state(user_id, device_id, presence, status_msg)

    async def status(self, requester: str, user_id: str) -> dict[str, Any]:
        """``GET /presence/{userId}/status``: 403 unless ``requester`` is the user or
        shares a room with them (Synapse's ``is_visible``)."""
        if not self.enabled:
            return {"presence": OFFLINE}
        if requester != user_id and not await self.store.visible_to(requester, user_id):
            raise ForbiddenError("You are not allowed to see their presence.")
        state = (await self.store.current([user_id]))[user_id]
        return state.content(self._clock())

    @contextlib.asynccontextmanager
    async def syncing(
        self, user_id: str, device_id: str | None, set_presence: str
    ) -> AsyncIterator[None]:
        """Around a sync: the device is syncing (``set_presence`` ``offline``: the sync
        does not touch presence, as in Synapse)."""
        target: PresenceWriter | RemotePresence | None = self.writer or self.remote
        if not self.enabled or set_presence == OFFLINE or target is None:
            yield
            return
        try:
            await target.sync_started(user_id, device_id, set_presence)
        except Exception:
            # Presence must not fail a sync (the sync is counted all the same).
            logger.exception("presence: recording the sync of %s failed", user_id)
        try:
            yield
        finally:
            target.sync_ended(user_id, device_id)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.remote is not None:
            self.remote.close()
