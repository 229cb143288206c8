"""The relay of a process that is not the presence writer (RemotePresence, as Synapse's
WorkerPresenceHandler) and the writer's side of the commands, with a fake clock: what is
relayed over the internal API and which USER_SYNC / CLEAR_USER_SYNC commands are sent."""

from __future__ import annotations

from typing import Any

import pytest

from roomstream.client import presence_timeouts
from roomstream.client.presence import ONLINE, UNAVAILABLE, PresenceTimeouts
from roomstream.client.presence_service import RemotePresence
from roomstream.config import ConfigError, parse_config
from roomstream.replication.commands import ClearUserSyncCommand, Command, UserSyncCommand

TIMEOUTS = PresenceTimeouts(
    idle_ms=60_000, sync_online_ms=30_000, last_active_granularity_ms=60_000,
    process_expiry_ms=300_000,
)  # fmt: skip


class Fake:
    def __init__(self) -> None:
        self.now = 1_000
        self.relayed: list[tuple[Any, ...]] = []
        self.sent: list[Command] = []

    async def relay(self, *args: Any) -> None:
        self.relayed.append(args)

    def relay_of(self) -> RemotePresence:
        return RemotePresence("reader", TIMEOUTS, self.relay, self.sent.append, lambda: self.now)


async def test_syncs_in_a_row_send_one_start_and_a_late_end() -> None:
    fake = Fake()
    relay = fake.relay_of()
    await relay.sync_started("@a:hs", "D", ONLINE)
    relay.sync_ended("@a:hs", "D")
    fake.now += 100
    # The client's next long poll: no second start, and no relay while unchanged.
    await relay.sync_started("@a:hs", "D", ONLINE)
    assert fake.sent == [UserSyncCommand("reader", "@a:hs", "D", True, 1_000)]
    assert fake.relayed == [("@a:hs", "D", ONLINE, None, True)]
    # A changed set_presence is relayed at once; an unchanged one after the interval.
    await relay.sync_started("@a:hs", "D", UNAVAILABLE)
    fake.now += relay.relay_interval_ms
    await relay.sync_started("@a:hs", "D", UNAVAILABLE)
    assert [r[2] for r in fake.relayed] == [ONLINE, UNAVAILABLE, UNAVAILABLE]
    for _ in range(3):
        relay.sync_ended("@a:hs", "D")
    ended = fake.now
    fake.now += relay.end_delay_ms - 1
    relay.tick()
    assert len(fake.sent) == 1  # not yet: a next poll may follow
    # Keepalives announce the devices still syncing: none now.
    relay.keepalive()
    assert len(fake.sent) == 1
    fake.now += 1
    relay.tick()
    assert fake.sent[1:] == [UserSyncCommand("reader", "@a:hs", "D", False, ended)]
    relay.close()
    relay.close()
    assert fake.sent[2:] == [ClearUserSyncCommand("reader")]


async def test_keepalive_announces_every_device_syncing() -> None:
    fake = Fake()
    relay = fake.relay_of()
    await relay.sync_started("@a:hs", "D", ONLINE)
    await relay.sync_started("@b:hs", None, ONLINE)
    fake.sent.clear()
    fake.now += relay.keepalive_ms
    relay.keepalive()
    assert sorted(fake.sent, key=repr) == [
        UserSyncCommand("reader", "@a:hs", "D", True, fake.now),
        UserSyncCommand("reader", "@b:hs", None, True, fake.now),
    ]


async def test_a_failed_relay_does_not_fail_the_sync_and_is_retried() -> None:
    fake = Fake()
    calls = []

    async def failing(*args: Any) -> None:
        calls.append(args)
        raise OSError("writer down")

    relay = RemotePresence("reader", TIMEOUTS, failing, fake.sent.append, lambda: fake.now)
    await relay.sync_started("@a:hs", "D", ONLINE)
    relay.sync_ended("@a:hs", "D")
    await relay.sync_started("@a:hs", "D", ONLINE)
    assert len(calls) == 2
    assert fake.sent == [UserSyncCommand("reader", "@a:hs", "D", True, 1_000)]


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ({"presence": {"sync_timeout": 0}}, "presence.sync_timeout must be positive, not 0"),
        ({"presence": {"idle_timeout": "5"}}, "presence.idle_timeout must be a number, not '5'"),
        ({"presence": {"enabled": 1}}, "presence.enabled must be true or false"),
        ({"presence": {"typo": 1}}, "unknown keys in presence: typo"),
        (
            {
                "stream_writers": {"presence": ["main", "other"]},
                "instances": {"main": {}, "other": {}},
            },
            "stream_writers.presence must name one instance: presence has a single writer",
        ),
    ],
)
def test_configuration_mistakes_are_one_line_each(
    raw: dict[str, Any], problem: str, tmp_path: Any
) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config({"data_dir": str(tmp_path), **raw})
    assert raised.value.problems == [problem]


def test_configured_timeouts_reach_the_machine(tmp_path: Any) -> None:
    config = parse_config({"data_dir": str(tmp_path), "presence": {"sync_timeout": 1.5}})
    assert presence_timeouts(config.presence) == PresenceTimeouts(sync_online_ms=1500)
