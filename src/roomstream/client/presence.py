"""Presence as a pure state machine: what each user's presence is, given what their
devices did and the time (passed in, in milliseconds; no I/O, no clock, no timers).

It follows Synapse's ``synapse/handlers/presence.py`` (``set_state``, ``user_syncing``,
``handle_update``, ``handle_timeout``, ``should_notify``), without federation:

- a device that syncs or sets its presence is ``online`` (or what it asked for) and
  active now; a user's presence is their "best" device's (online > unavailable >
  offline, ties by the latest activity);
- an online device with no activity for ``idle_ms`` becomes ``unavailable``;
- a device that is not syncing (on this process or on any other one that said so with
  ``USER_SYNC``) and neither synced nor was active for ``sync_online_ms`` is dropped; a
  user with no device left is ``offline``;
- ``currently_active`` is true while the last activity is under
  ``last_active_granularity_ms`` old (and the user is online);
- another process's syncing devices count until it says ``CLEAR_USER_SYNC`` or sends no
  ``USER_SYNC`` for ``process_expiry_ms`` (it died): then they time out as above.

Every method returns the users' new states that are worth telling anyone about
(Synapse's ``should_notify``): those are persisted and sent to clients; other changes
(a newer ``last_user_sync_ts``) stay in memory. :meth:`PresenceMachine.next_deadline`
says when :meth:`PresenceMachine.timeouts` has something to check.

Invariant: for every user not ``offline`` a timer is pending at or before the earliest
time one of the rules above could change their state, so calling :meth:`timeouts` at
each deadline applies every timeout no later than due.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = [
    "OFFLINE",
    "ONLINE",
    "PRESENCE_STATES",
    "UNAVAILABLE",
    "PresenceMachine",
    "PresenceTimeouts",
    "UserPresence",
]

ONLINE = "online"
UNAVAILABLE = "unavailable"
OFFLINE = "offline"
#: The presence states a client may set (the spec's; Synapse's experimental ``busy`` is not).
PRESENCE_STATES = (ONLINE, UNAVAILABLE, OFFLINE)
_PRIORITY = {ONLINE: 3, UNAVAILABLE: 2, OFFLINE: 1}

#: A device of a user; None is the pseudo-device of a state restored from storage.
Device = str | None


@dataclass(frozen=True)
class PresenceTimeouts:
    """Synapse's constants (``IDLE_TIMER``, ``SYNC_ONLINE_TIMEOUT``,
    ``LAST_ACTIVE_GRANULARITY``, ``EXTERNAL_PROCESS_EXPIRY``), in milliseconds."""

    idle_ms: int = 5 * 60 * 1000
    sync_online_ms: int = 30 * 1000
    last_active_granularity_ms: int = 60 * 1000
    process_expiry_ms: int = 5 * 60 * 1000


class UserPresence(NamedTuple):
    """A user's presence, as the ``presence`` stream's row carries it (Synapse's
    ``UserPresenceState``; timestamps in ms since the epoch, 0 for never)."""

    user_id: str
    state: str = OFFLINE
    last_active_ts: int = 0
    last_federation_update_ts: int = 0
    last_user_sync_ts: int = 0
    status_msg: str | None = None
    currently_active: bool = False

    def to_wire(self) -> tuple[Any, ...]:
        return tuple(self)

    def content(self, now: int) -> dict[str, Any]:
        """The ``m.presence`` content (and ``GET /presence/{userId}/status``'s answer)."""
        content: dict[str, Any] = {"presence": self.state}
        if self.last_active_ts:
            content["last_active_ago"] = max(0, now - self.last_active_ts)
        if self.status_msg:
            content["status_msg"] = self.status_msg
        if self.state == ONLINE:
            content["currently_active"] = self.currently_active
        return content


@dataclass
class _Device:
    state: str
    last_active_ts: int
    last_sync_ts: int


def _combine(devices: Iterable[_Device]) -> str:
    """The user's presence from their devices' (best state, then latest activity)."""
    best, best_active = OFFLINE, -1
    for device in devices:
        if (_PRIORITY[device.state], device.last_active_ts) > (_PRIORITY[best], best_active):
            best, best_active = device.state, device.last_active_ts
    return best


def should_notify(old: UserPresence, new: UserPresence, granularity_ms: int) -> bool:
    """Whether a change is worth sending to clients (Synapse's ``should_notify``)."""
    if old == new:
        return False
    if old.status_msg != new.status_msg or old.state != new.state:
        return True
    if old.state == ONLINE:
        if new.currently_active != old.currently_active:
            return True
        return new.last_active_ts - old.last_active_ts > granularity_ms and not new.currently_active
    return new.last_active_ts - old.last_active_ts > granularity_ms


class PresenceMachine:
    """The presence of every user of this homeserver (see the module docstring).

    ``restored``: states read back from storage at start; each user not offline gets a
    pseudo-device with their state, which times out as a device does unless a real one
    comes along."""

    def __init__(
        self, timeouts: PresenceTimeouts, restored: Iterable[UserPresence] = (), now: int = 0
    ) -> None:
        self.config = timeouts
        self._states: dict[str, UserPresence] = {}
        self._devices: dict[str, dict[Device, _Device]] = {}
        #: (user, device) -> syncs in progress on this process.
        self._syncs: Counter[tuple[str, Device]] = Counter()
        #: process -> (user, device) syncing there, and when it last said anything.
        self._external: dict[str, set[tuple[str, Device]]] = {}
        self._external_seen: dict[str, int] = {}
        #: (when, user): the user's next deadline; an entry is current only while it is
        #: the user's ``_due`` (earlier ones supersede, later ones are dropped when due).
        self._timers: list[tuple[int, str]] = []
        self._due: dict[str, int] = {}
        for state in restored:
            if state.state == OFFLINE:
                continue
            self._states[state.user_id] = state
            self._devices[state.user_id] = {
                None: _Device(state.state, state.last_active_ts, state.last_user_sync_ts)
            }
            self._arm(state.user_id, now)

    # -- reading -----------------------------------------------------------------------

    def current(self, user_id: str) -> UserPresence:
        return self._states.get(user_id) or UserPresence(user_id)

    def syncing(self, user_id: str, device_id: Device) -> bool:
        """Whether a sync of the device is in progress here or on another process."""
        key = (user_id, device_id)
        return self._syncs[key] > 0 or any(key in s for s in self._external.values())

    def next_deadline(self) -> int | None:
        """When :meth:`timeouts` next has something to check (None: nothing pending)."""
        deadlines = [when for when, _ in self._timers[:1]]
        deadlines.extend(
            seen + self.config.process_expiry_ms for seen in self._external_seen.values()
        )
        return min(deadlines, default=None)

    # -- what devices do ---------------------------------------------------------------

    def set_state(
        self,
        user_id: str,
        device_id: Device,
        presence: str,
        now: int,
        *,
        status_msg: str | None = None,
        is_sync: bool = False,
    ) -> list[UserPresence]:
        """The device set its presence (``PUT /presence/{userId}/status``: the status
        message too, None clearing it) or synced with ``set_presence`` (``is_sync``: the
        status message is kept). ValueError for a presence that is not one of
        :data:`PRESENCE_STATES`."""
        if presence not in PRESENCE_STATES:
            raise ValueError(f"unknown presence {presence!r}")
        devices = self._devices.setdefault(user_id, {})
        device = devices.setdefault(device_id, _Device(OFFLINE, 0, 0))
        device.state = presence
        device.last_active_ts = now
        if is_sync:
            device.last_sync_ts = now
        combined = _combine(devices.values())
        prev = self.current(user_id)
        new = prev._replace(state=combined)
        if combined == ONLINE:
            new = new._replace(last_active_ts=now)
        if is_sync:
            new = new._replace(last_user_sync_ts=now)
        else:
            new = new._replace(status_msg=status_msg)
        return self._update([new], now)

    def sync_started(
        self, user_id: str, device_id: Device, presence: str, now: int
    ) -> list[UserPresence]:
        """A sync of the device began here with ``set_presence`` ``presence`` (a sync
        with ``offline`` does not count: the caller does not call this)."""
        self._syncs[(user_id, device_id)] += 1
        return self.set_state(user_id, device_id, presence, now, is_sync=True)

    def sync_ended(self, user_id: str, device_id: Device, now: int) -> list[UserPresence]:
        key = (user_id, device_id)
        if self._syncs[key] <= 1:
            del self._syncs[key]
        else:
            self._syncs[key] -= 1
        return self._synced(user_id, device_id, now)

    def _synced(self, user_id: str, device_id: Device, now: int) -> list[UserPresence]:
        """The device synced at ``now`` (its sync ended then)."""
        device = self._devices.get(user_id, {}).get(device_id)
        if device is not None:
            device.last_sync_ts = max(device.last_sync_ts, now)
        prev = self.current(user_id)
        return self._update([prev._replace(last_user_sync_ts=now)], now)

    # -- other processes (USER_SYNC, CLEAR_USER_SYNC) -----------------------------------

    def external_sync(
        self,
        process_id: str,
        user_id: str,
        device_id: Device,
        syncing: bool,
        last_sync_ms: int,
        now: int,
    ) -> list[UserPresence]:
        """``USER_SYNC``: the device started (or, with ``syncing`` false, stopped)
        syncing on ``process_id``. Any command from the process keeps it alive."""
        current = self._external.setdefault(process_id, set())
        self._external_seen[process_id] = now
        key = (user_id, device_id)
        if syncing:
            current.add(key)
            return []
        if key not in current:
            return []
        current.discard(key)
        return self._synced(user_id, device_id, min(last_sync_ms, now))

    def external_alive(self, process_id: str, now: int) -> None:
        """The process said something: its syncs are still in progress."""
        if process_id in self._external_seen:
            self._external_seen[process_id] = now

    def external_clear(self, process_id: str, now: int) -> list[UserPresence]:
        """``CLEAR_USER_SYNC`` (or the process expired): its devices stopped syncing
        now; they time out as any device that stopped syncing."""
        gone = self._external.pop(process_id, set())
        self._external_seen.pop(process_id, None)
        changes: list[UserPresence] = []
        for user_id, device_id in sorted(gone, key=lambda k: (k[0], k[1] or "")):
            changes.extend(self._synced(user_id, device_id, now))
        return changes

    # -- time --------------------------------------------------------------------------

    def timeouts(self, now: int) -> list[UserPresence]:
        """Apply every timeout due by ``now`` (Synapse's ``_handle_timeouts``)."""
        users: set[str] = set()
        while self._timers and self._timers[0][0] <= now:
            when, user_id = heapq.heappop(self._timers)
            if self._due.get(user_id) == when:
                del self._due[user_id]
                users.add(user_id)
        expired = [
            p
            for p, seen in self._external_seen.items()
            if now - seen >= self.config.process_expiry_ms
        ]
        changes: list[UserPresence] = []
        for process_id in expired:
            users.update(user_id for user_id, _ in self._external.get(process_id, ()))
            changes.extend(self.external_clear(process_id, now))
        timed_out = [s for s in map(self._timed_out, sorted(users), [now] * len(users)) if s]
        changes.extend(self._update(timed_out, now))
        for user_id in users:
            self._arm(user_id, now)
        return changes

    def _timed_out(self, user_id: str, now: int) -> UserPresence | None:
        """Synapse's ``handle_timeout`` for a local user (None: nothing changed)."""
        state = self._states.get(user_id)
        if state is None or state.state == OFFLINE:
            return None
        t = self.config
        devices = self._devices.setdefault(user_id, {})
        changed = device_changed = False
        for device_id, device in list(devices.items()):
            if device.state == ONLINE and now - device.last_active_ts > t.idle_ms:
                device.state = UNAVAILABLE
                device_changed = True
            if not self.syncing(user_id, device_id):
                last_seen = max(device.last_sync_ts, device.last_active_ts)
                if now - last_seen > t.sync_online_ms:
                    del devices[device_id]
                    device_changed = True
        if device_changed:
            combined = _combine(devices.values())
            if combined != state.state:
                state = state._replace(state=combined)
                changed = True
        if now - state.last_active_ts > t.last_active_granularity_ms:
            changed = True  # currently_active may end (handle_update decides)
        if not devices:
            del self._devices[user_id]
        return state if changed else None

    # -- updating ----------------------------------------------------------------------

    def _arm(self, user_id: str, now: int) -> None:
        """Make the user's pending deadline the earliest moment after ``now`` at which a
        rule could change their state (none for an offline user)."""
        state = self._states.get(user_id)
        if state is None or state.state == OFFLINE:
            return
        t = self.config
        candidates = []
        for device_id, device in self._devices.get(user_id, {}).items():
            if device.state == ONLINE:
                candidates.append(device.last_active_ts + t.idle_ms + 1)
            if not self.syncing(user_id, device_id):
                last_seen = max(device.last_sync_ts, device.last_active_ts)
                candidates.append(last_seen + t.sync_online_ms + 1)
        if state.currently_active:
            candidates.append(state.last_active_ts + t.last_active_granularity_ms + 1)
        if not candidates:
            return
        # Never at or before now: a rule due now was applied by whoever called this.
        when = max(min(candidates), now + 1)
        due = self._due.get(user_id)
        if due is None or when < due or due <= now:
            self._due[user_id] = when
            heapq.heappush(self._timers, (when, user_id))

    def _update(self, new_states: list[UserPresence], now: int) -> list[UserPresence]:
        """Synapse's ``_update_states`` and ``handle_update``: keep each new state, set
        the timers it needs, and return those worth notifying about."""
        t = self.config
        latest = {s.user_id: s for s in new_states}
        notify: list[UserPresence] = []
        for user_id, new in latest.items():
            prev = self.current(user_id)
            if new.state == ONLINE:
                active = now - new.last_active_ts < t.last_active_granularity_ms
                new = new._replace(currently_active=active)
            if should_notify(prev, new, t.last_active_granularity_ms):
                new = new._replace(last_federation_update_ts=now)
                notify.append(new)
            if new.state == OFFLINE:
                self._states.pop(user_id, None)
                self._devices.pop(user_id, None)
                if new != UserPresence(user_id):
                    self._states[user_id] = new
            else:
                self._states[user_id] = new
                self._arm(user_id, now)
        return notify
