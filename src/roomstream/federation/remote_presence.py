"""Remote users' presence going stale: a remote user whose server has said nothing of
them for :data:`FEDERATION_PRESENCE_TIMEOUT_MS` (Synapse's ``FEDERATION_TIMEOUT``, 30
minutes) is offline (their server is down, or stopped telling us).

:func:`expired_remote_states` is the rule, without I/O (time passed in);
:class:`RemotePresenceExpiry` applies it now and then on the ``presence`` stream's writer
(the process that stores remote presence, see
:meth:`~roomstream.federation.edus.FederationEdus.for_client_process`): the stored states
that are not offline are read, and those of remote users last updated by their server
too long ago are stored offline (a new ``presence`` row each: local users' syncs see
them go offline).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence

from roomstream.client import ClientProcess
from roomstream.client.presence import OFFLINE, UserPresence
from roomstream.federation.membership import server_of

__all__ = [
    "FEDERATION_PRESENCE_TIMEOUT_MS",
    "RemotePresenceExpiry",
    "expired_remote_states",
]

logger = logging.getLogger(__name__)

#: A remote user not updated by their server for this long is offline (Synapse's).
FEDERATION_PRESENCE_TIMEOUT_MS = 30 * 60 * 1000
#: How often :class:`RemotePresenceExpiry` looks (seconds).
SWEEP_INTERVAL = 60.0


def expired_remote_states(
    states: Iterable[UserPresence], server_name: str, now_ms: int
) -> list[UserPresence]:
    """The offline states due for remote users of ``states`` (not of ``server_name``)
    whose ``last_federation_update_ts`` is :data:`FEDERATION_PRESENCE_TIMEOUT_MS` or more
    before ``now_ms``; their status message and last activity are kept, as Synapse."""
    due = []
    for state in states:
        if state.state == OFFLINE or server_of(state.user_id) in ("", server_name):
            continue
        if now_ms - state.last_federation_update_ts >= FEDERATION_PRESENCE_TIMEOUT_MS:
            due.append(state._replace(state=OFFLINE, currently_active=False))
    return due


class RemotePresenceExpiry:
    """Runs :func:`expired_remote_states` every :data:`SWEEP_INTERVAL` seconds over
    ``not_offline()`` (the stored states) and stores what it returns with ``persist``."""

    def __init__(
        self,
        server_name: str,
        not_offline: Callable[[], Awaitable[Sequence[UserPresence]]],
        persist: Callable[[Sequence[UserPresence]], Awaitable[object]],
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.server_name = server_name
        self._not_offline = not_offline
        self._persist = persist
        self._clock = clock_ms
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def for_client_process(cls, process: ClientProcess) -> RemotePresenceExpiry | None:
        """The expiry on a process that stores remote presence (None elsewhere: it has
        nothing to expire). The caller starts and closes it."""
        presence = process.presence
        if not presence.enabled or presence.writer is None:
            return None
        store = presence.store
        return cls(process.config.server_name, store.not_offline, store.persist)

    async def sweep(self) -> list[UserPresence]:
        """One look: the states stored offline now."""
        due = expired_remote_states(await self._not_offline(), self.server_name, self._clock())
        if due:
            await self._persist(due)
        return due

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL)
            try:
                await self.sweep()
            except Exception:
                # Tried again at the next interval; presence is never worth a crash.
                logger.exception("expiring remote users' presence failed")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
