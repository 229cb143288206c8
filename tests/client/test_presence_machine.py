"""The presence state machine (roomstream.client.presence) against a naive model.

The model keeps, per device, what it last did and re-evaluates every rule at every
millisecond; the machine is only woken at its own deadlines (``next_deadline``). For any
sequence of actions (syncs starting and ending here or on other processes, presence set,
processes clearing or going silent) both must agree on every user's presence at every
moment an action happens and at the end, and the machine must never sleep past a due
change. Timeouts are a few milliseconds so that every rule fires in a short scenario.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from roomstream.client.presence import (
    OFFLINE,
    ONLINE,
    PRESENCE_STATES,
    UNAVAILABLE,
    PresenceMachine,
    PresenceTimeouts,
    UserPresence,
)

TIMEOUTS = PresenceTimeouts(
    idle_ms=7, sync_online_ms=5, last_active_granularity_ms=3, process_expiry_ms=11
)
USERS = ("@a:hs", "@b:hs")
DEVICES = ("D1", "D2")
PROCESSES = ("reader1", "reader2")
_PRIORITY = {ONLINE: 3, UNAVAILABLE: 2, OFFLINE: 1}


@dataclass
class NaiveDevice:
    state: str
    active: int
    synced: int


@dataclass
class Naive:
    """Every rule re-checked at every millisecond (see the module docstring)."""

    t: PresenceTimeouts
    devices: dict[tuple[str, str], NaiveDevice] = field(default_factory=dict)
    local: dict[tuple[str, str], int] = field(default_factory=dict)
    external: dict[str, set[tuple[str, str]]] = field(default_factory=dict)
    seen: dict[str, int] = field(default_factory=dict)
    now: int = 0

    def syncing(self, key: tuple[str, str]) -> bool:
        return self.local.get(key, 0) > 0 or any(key in s for s in self.external.values())

    def presence(self, user: str) -> str:
        best, best_active = OFFLINE, -1
        for (u, _), d in sorted(self.devices.items()):
            if u == user and (_PRIORITY[d.state], d.active) > (_PRIORITY[best], best_active):
                best, best_active = d.state, d.active
        return best

    def tick_to(self, when: int) -> None:
        while self.now < when:
            self.now += 1
            self.apply_rules()

    def apply_rules(self) -> None:
        now, t = self.now, self.t
        for process in [p for p, s in self.seen.items() if now - s >= t.process_expiry_ms]:
            self.clear(process)
        for key, d in list(self.devices.items()):
            if d.state == ONLINE and now - d.active > t.idle_ms:
                d.state = UNAVAILABLE
            if not self.syncing(key) and now - max(d.synced, d.active) > t.sync_online_ms:
                del self.devices[key]

    def set_state(self, key: tuple[str, str], presence: str, is_sync: bool) -> None:
        d = self.devices.setdefault(key, NaiveDevice(OFFLINE, 0, 0))
        d.state, d.active = presence, self.now
        if is_sync:
            d.synced = self.now
        if self.presence(key[0]) == OFFLINE:
            # An offline user keeps no devices (a later sync starts afresh).
            for k in [k for k in self.devices if k[0] == key[0]]:
                del self.devices[k]

    def synced(self, key: tuple[str, str], when: int) -> None:
        d = self.devices.get(key)
        if d is not None:
            d.synced = max(d.synced, when)

    def clear(self, process: str) -> None:
        for key in self.external.pop(process, set()):
            self.synced(key, self.now)
        self.seen.pop(process, None)


action = st.one_of(
    st.tuples(st.just("start"), st.sampled_from(USERS), st.sampled_from(DEVICES),
              st.sampled_from([ONLINE, UNAVAILABLE])),
    st.tuples(st.just("end"), st.sampled_from(USERS), st.sampled_from(DEVICES)),
    st.tuples(st.just("set"), st.sampled_from(USERS), st.sampled_from(DEVICES),
              st.sampled_from(PRESENCE_STATES)),
    st.tuples(st.just("ext"), st.sampled_from(PROCESSES), st.sampled_from(USERS),
              st.sampled_from(DEVICES), st.booleans()),
    st.tuples(st.just("clear"), st.sampled_from(PROCESSES)),
)  # fmt: skip
steps = st.lists(st.tuples(st.integers(0, 9), action), max_size=40)


def _advance(
    machine: PresenceMachine, model: Naive, until: int, notified: list[UserPresence]
) -> None:
    """Wake the machine at each of its deadlines up to ``until``; the model ticks."""
    while True:
        deadline = machine.next_deadline()
        if deadline is None or deadline > until:
            break
        model.tick_to(deadline)
        notified.extend(machine.timeouts(deadline))
        for user in USERS:
            assert machine.current(user).state == model.presence(user), (user, deadline)
    model.tick_to(until)


@settings(max_examples=400, deadline=None)
@given(steps)
def test_machine_agrees_with_the_naive_model(script: list[tuple[int, tuple[Any, ...]]]) -> None:
    machine = PresenceMachine(TIMEOUTS)
    model = Naive(TIMEOUTS)
    notified: list[UserPresence] = []
    now = 0
    for delay, act in script:
        now += delay
        _advance(machine, model, now, notified)
        for user in USERS:  # nothing due was left undone
            assert machine.current(user).state == model.presence(user), (user, now)
        kind = act[0]
        if kind == "start":
            _, user, device, presence = act
            model.local[(user, device)] = model.local.get((user, device), 0) + 1
            model.set_state((user, device), presence, is_sync=True)
            notified.extend(machine.sync_started(user, device, presence, now))
        elif kind == "end":
            _, user, device = act
            if model.local.get((user, device), 0) == 0:
                continue  # a sync ends only after it started
            model.local[(user, device)] -= 1
            model.synced((user, device), now)
            notified.extend(machine.sync_ended(user, device, now))
        elif kind == "set":
            _, user, device, presence = act
            model.set_state((user, device), presence, is_sync=False)
            notified.extend(machine.set_state(user, device, presence, now, status_msg="hi"))
        elif kind == "ext":
            _, process, user, device, syncing = act
            model.seen[process] = now
            current = model.external.setdefault(process, set())
            if syncing:
                current.add((user, device))
            elif (user, device) in current:
                current.discard((user, device))
                model.synced((user, device), now)
            notified.extend(machine.external_sync(process, user, device, syncing, now, now))
        else:
            model.clear(act[1])
            notified.extend(machine.external_clear(act[1], now))
        for user in USERS:
            assert machine.current(user).state == model.presence(user), (user, now, act)
    # Long after the last action: everyone not syncing here is offline, and the
    # machine got there through its own deadlines.
    _advance(machine, model, now + 100, notified)
    for user in USERS:
        expected = model.presence(user)
        assert machine.current(user).state == expected
        if not any(model.local.get((user, d), 0) for d in DEVICES):
            assert expected == OFFLINE
    # Every notified state differs from the one notified before it for that user.
    last: dict[str, UserPresence] = {}
    for state in notified:
        assert last.get(state.user_id) != state
        last[state.user_id] = state


def test_syncing_keeps_a_user_online_and_idleness_then_silence_takes_them_offline() -> None:
    t = PresenceTimeouts(idle_ms=100, sync_online_ms=300, last_active_granularity_ms=50)
    machine = PresenceMachine(t)
    [online] = machine.sync_started("@a:hs", "D", ONLINE, 1000)
    assert (online.state, online.currently_active) == (ONLINE, True)
    # A sync lasting longer than the idle timer: unavailable (as Synapse: a sync marks
    # activity only when it starts), but never offline while it lasts.
    assert [s.currently_active for s in machine.timeouts(1051)] == [False]
    assert [s.state for s in machine.timeouts(1101)] == [UNAVAILABLE]
    assert machine.timeouts(5000) == []
    assert machine.current("@a:hs").state == UNAVAILABLE
    machine.sync_ended("@a:hs", "D", 5000)
    assert machine.next_deadline() == 5301
    assert machine.timeouts(5300) == []
    [offline] = machine.timeouts(5301)
    assert offline.state == OFFLINE
    assert machine.next_deadline() is None


def test_a_silent_process_expires_and_its_users_time_out() -> None:
    t = PresenceTimeouts(idle_ms=10_000, sync_online_ms=300, process_expiry_ms=1000)
    machine = PresenceMachine(t)
    machine.set_state("@a:hs", "D", ONLINE, 0, status_msg=None)
    assert machine.external_sync("reader", "@a:hs", "D", True, 0, 0) == []
    assert machine.timeouts(999) == []  # still syncing there
    assert machine.current("@a:hs").state == ONLINE
    assert machine.timeouts(1000) == []  # expired: stopped syncing at 1000
    assert machine.next_deadline() == 1301
    assert [s.state for s in machine.timeouts(1301)] == [OFFLINE]


def test_restored_states_time_out_unless_a_device_comes_back() -> None:
    t = PresenceTimeouts(idle_ms=10_000, sync_online_ms=300)
    restored = [
        UserPresence("@a:hs", ONLINE, 900, 0, 900, "lunch", True),
        UserPresence("@b:hs", ONLINE, 900, 0, 900, None, True),
    ]
    machine = PresenceMachine(t, restored, now=1000)
    machine.sync_started("@b:hs", "D", ONLINE, 1100)
    changes = machine.timeouts(1201)
    assert [(s.user_id, s.state) for s in changes if s.state == OFFLINE] == [("@a:hs", OFFLINE)]
    assert machine.current("@a:hs").status_msg == "lunch"
    assert machine.current("@b:hs").state == ONLINE


def test_status_message_is_kept_by_syncs_and_set_by_put() -> None:
    machine = PresenceMachine(PresenceTimeouts())
    [s] = machine.set_state("@a:hs", "D", UNAVAILABLE, 10, status_msg="away")
    assert (s.state, s.status_msg) == (UNAVAILABLE, "away")
    [s] = machine.sync_started("@a:hs", "D", ONLINE, 20)
    assert (s.state, s.status_msg) == (ONLINE, "away")
    assert s.content(25) == {
        "presence": ONLINE,
        "last_active_ago": 5,
        "status_msg": "away",
        "currently_active": True,
    }
