"""Presence through the API, on both engines: ``GET``/``PUT /presence/{userId}/status``,
``set_presence`` on ``/sync``, the ``presence`` section of ``/sync`` (room-mates only,
its own token part, long polls woken), and the timeouts (configured short: unavailable
after the idle timeout, offline once a device has neither synced nor been active for the
sync timeout)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from roomstream.client import ClientProcess, presence_timeouts
from roomstream.client.presence_service import PresenceWriter
from roomstream.config import PresenceConfig
from roomstream.replication.commands import ClearUserSyncCommand, UserSyncCommand
from roomstream.storage import DatabaseConfig
from tests.support.homeserver import Homeserver, User, make_config, serve_homeserver
from tests.support.wait import wait_for


async def _room_with(hs: Homeserver, alice: User, bob: User) -> str:
    room = (await hs.ok("POST", "/createRoom", {}, token=alice.token))["room_id"]
    await hs.ok("POST", f"/rooms/{room}/invite", {"user_id": bob.user_id}, token=alice.token)
    await hs.ok("POST", f"/join/{room}", {}, token=bob.token)
    return str(room)


def _presence_of(body: dict[str, Any], user_id: str) -> list[dict[str, Any]]:
    return [
        e["content"]
        for e in body["presence"]["events"]
        if e["type"] == "m.presence" and e["sender"] == user_id
    ]


async def test_status_put_and_get(homeserver: Homeserver) -> None:
    hs = homeserver
    alice, bob, carol = [await hs.register(n) for n in ("alice", "bob", "carol")]
    await _room_with(hs, alice, bob)
    # Nobody set anything yet: offline, never active.
    assert await hs.ok("GET", f"/presence/{bob.user_id}/status", token=alice.token) == {
        "presence": "offline"
    }
    body = {"presence": "unavailable", "status_msg": "lunch"}
    assert await hs.ok("PUT", f"/presence/{alice.user_id}/status", body, token=alice.token) == {}
    for reader in (alice, bob):
        got = await hs.ok("GET", f"/presence/{alice.user_id}/status", token=reader.token)
        assert got["presence"] == "unavailable"
        assert got["status_msg"] == "lunch"
        assert "currently_active" not in got  # only for online users
    # A status without status_msg clears it (as in Synapse).
    online = {"presence": "online"}
    await hs.ok("PUT", f"/presence/{alice.user_id}/status", online, token=alice.token)
    got = await hs.ok("GET", f"/presence/{alice.user_id}/status", token=bob.token)
    assert got["presence"] == "online"
    assert got["currently_active"] is True
    assert "status_msg" not in got
    assert 0 <= got["last_active_ago"] < 60_000
    # carol shares no room with alice: 403, as for a user who does not exist.
    for target in (alice.user_id, "@nobody:test.local"):
        status, err = await hs.call("GET", f"/presence/{target}/status", token=carol.token)
        assert (status, err["errcode"]) == (403, "M_FORBIDDEN")


@pytest.mark.parametrize(
    ("path_user", "body", "status", "errcode"),
    [
        ("bob", {"presence": "online"}, 403, "M_FORBIDDEN"),
        ("alice", {}, 400, "M_MISSING_PARAM"),
        ("alice", {"presence": "busy"}, 400, "M_INVALID_PARAM"),
        ("alice", {"presence": 1}, 400, "M_BAD_JSON"),
        ("alice", {"presence": "online", "status_msg": 5}, 400, "M_BAD_JSON"),
        ("alice", {"presence": "online", "status_msg": "x" * 2049}, 400, "M_INVALID_PARAM"),
        ("alice", {"presence": "online", "currently_active": True}, 400, "M_BAD_JSON"),
        ("not-a-user", {"presence": "online"}, 400, "M_INVALID_PARAM"),
    ],
)
async def test_bad_puts(
    homeserver: Homeserver, path_user: str, body: Any, status: int, errcode: str
) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    target = {"alice": alice.user_id, "bob": bob.user_id}.get(path_user, path_user)
    got, err = await hs.call("PUT", f"/presence/{target}/status", body, token=alice.token)
    assert (got, err["errcode"]) == (status, errcode)
    # Nothing was recorded.
    assert await hs.ok("GET", f"/presence/{alice.user_id}/status", token=alice.token) == {
        "presence": "offline"
    }


async def test_sync_shows_room_mates_presence_and_wakes_on_change(homeserver: Homeserver) -> None:
    hs = homeserver
    alice, bob, carol = [await hs.register(n) for n in ("alice", "bob", "carol")]
    await _room_with(hs, alice, bob)
    # alice's sync makes her online (set_presence defaults to online).
    await hs.ok("GET", "/sync", token=alice.token)
    first = await hs.ok("GET", "/sync?set_presence=offline", token=bob.token)
    [seen] = _presence_of(first, alice.user_id)
    assert seen["presence"] == "online"
    assert seen["currently_active"] is True
    # carol shares no room: she sees nobody's presence but her own.
    carols = await hs.ok("GET", "/sync?set_presence=offline", token=carol.token)
    assert {e["sender"] for e in carols["presence"]["events"]} <= {carol.user_id}
    # A long poll of bob's is woken by alice's change, and shows only the change.
    since = first["next_batch"]
    assert len(since.split("_")) == 7
    poll = asyncio.create_task(
        hs.ok("GET", f"/sync?since={since}&timeout=60000&set_presence=offline", token=bob.token)
    )
    # (Whether the poll is waiting or not yet started when the change lands, its
    # answer is the same: the change is after its token.)
    body = {"presence": "unavailable", "status_msg": "away"}
    await hs.ok("PUT", f"/presence/{alice.user_id}/status", body, token=alice.token)
    woken = await asyncio.wait_for(poll, 30)
    assert [(c["presence"], c.get("status_msg")) for c in _presence_of(woken, alice.user_id)] == [
        ("unavailable", "away")
    ]
    quiet = await hs.ok(
        "GET", f"/sync?since={woken['next_batch']}&timeout=0&set_presence=offline", token=bob.token
    )
    assert quiet["presence"]["events"] == []
    # A token from before the presence part (six parts) still parses: changes since 0.
    old = "_".join(since.split("_")[:6])
    from_old = await hs.ok("GET", f"/sync?since={old}&set_presence=offline", token=bob.token)
    assert [c["presence"] for c in _presence_of(from_old, alice.user_id)] == ["unavailable"]
    # The presence filter applies.
    none = '{"presence":{"types":["m.nothing"]}}'
    filtered = await hs.ok("GET", f"/sync?filter={none}&set_presence=offline", token=bob.token)
    assert filtered["presence"]["events"] == []


async def test_set_presence_on_sync(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    status, err = await hs.call("GET", "/sync?set_presence=away", token=alice.token)
    assert (status, err["errcode"]) == (400, "M_INVALID_PARAM")
    # offline: the sync does not touch presence at all.
    await hs.ok("GET", "/sync?set_presence=offline", token=alice.token)
    own = f"/presence/{alice.user_id}/status"
    assert (await hs.ok("GET", own, token=alice.token))["presence"] == "offline"
    await hs.ok("GET", "/sync?set_presence=unavailable", token=alice.token)
    assert (await hs.ok("GET", own, token=alice.token))["presence"] == "unavailable"
    # A status message set by PUT is kept by syncs.
    await hs.ok("PUT", own, {"presence": "online", "status_msg": "hi"}, token=alice.token)
    await hs.ok("GET", "/sync", token=alice.token)
    got = await hs.ok("GET", own, token=alice.token)
    assert (got["presence"], got["status_msg"]) == ("online", "hi")


async def test_sliding_sync_keeps_a_user_online(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    path = "/_matrix/client/unstable/org.matrix.simplified_msc3575/sync"
    status, err = await hs.call("POST", path + "?set_presence=away", {}, token=alice.token)
    assert (status, err["errcode"]) == (400, "M_INVALID_PARAM")
    await hs.ok("POST", path + "?timeout=0", {}, token=alice.token)
    got = await hs.ok("GET", f"/presence/{alice.user_id}/status", token=alice.token)
    assert got["presence"] == "online"


# -- timeouts, configured short ----------------------------------------------------------

# Two seconds between unavailable and offline: a watcher's syncs see each change even on
# a loaded machine (a sync shows a user's latest state only).
SHORT = PresenceConfig(
    idle_timeout=1.0, sync_timeout=3.0, last_active_granularity=0.4, process_expiry=5.0
)


@pytest.fixture
async def short_presence(db_config: DatabaseConfig, tmp_path: Path) -> AsyncIterator[Homeserver]:
    config = make_config(db_config, tmp_path, presence=SHORT)

    async def start(process: ClientProcess) -> None:
        await process.start()

    async with serve_homeserver(config, prepare=start) as server:
        yield server


async def test_idle_then_offline_after_the_configured_timeouts(short_presence: Homeserver) -> None:
    hs = short_presence
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    await _room_with(hs, alice, bob)
    loop = asyncio.get_running_loop()
    synced_at = loop.time()  # before alice's sync starts: the timeouts count from later
    await hs.ok("GET", "/sync?timeout=0", token=alice.token)
    seen: list[tuple[float, str]] = []
    since = (await hs.ok("GET", "/sync?set_presence=offline", token=bob.token))["next_batch"]

    async def alice_state() -> str | None:
        nonlocal since
        body = await hs.ok(
            "GET", f"/sync?since={since}&timeout=200&set_presence=offline", token=bob.token
        )
        since = body["next_batch"]
        for content in _presence_of(body, alice.user_id):
            seen.append((loop.time() - synced_at, content["presence"]))
        return "offline" if seen and seen[-1][1] == "offline" else None

    await wait_for(alice_state, 30, "alice offline")
    states = [s for _, s in seen]
    assert states[-2:] == ["unavailable", "offline"]
    # Not before the configured timeouts (after alice's last sync).
    first_unavailable = next(t for t, s in seen if s == "unavailable")
    assert first_unavailable >= SHORT.idle_timeout
    assert seen[-1][0] >= SHORT.sync_timeout


async def test_a_long_sync_keeps_a_user_from_going_offline(short_presence: Homeserver) -> None:
    hs = short_presence
    alice = await hs.register("alice")
    own = f"/presence/{alice.user_id}/status"
    # (set_presence=offline: this sync leaves presence alone; only the long poll counts.)
    since = (await hs.ok("GET", "/sync?set_presence=offline", token=alice.token))["next_batch"]
    # A long poll far longer than the sync timeout (presence filtered out, so that her
    # own change does not end it): idle makes alice unavailable (a sync is activity
    # only when it starts, as in Synapse), never offline.
    no_presence = '{"presence":{"not_types":["*"]}}'
    poll = asyncio.create_task(
        hs.ok("GET", f"/sync?since={since}&timeout=7000&filter={no_presence}", token=alice.token)
    )

    async def unavailable() -> bool:
        return (await hs.ok("GET", own, token=alice.token))["presence"] == "unavailable"

    await wait_for(unavailable, 30, "alice unavailable")
    while not poll.done():
        assert (await hs.ok("GET", own, token=alice.token))["presence"] != "offline"
        await asyncio.sleep(0.1)
    await poll

    async def offline() -> bool:
        return (await hs.ok("GET", own, token=alice.token))["presence"] == "offline"

    await wait_for(offline, 30, "alice offline once her sync ended")


async def test_another_process_syncing_keeps_a_user_online_until_it_clears(
    short_presence: Homeserver,
) -> None:
    """The writer's side of USER_SYNC / CLEAR_USER_SYNC (what a reader sends)."""
    hs = short_presence
    writer = hs.process.presence.writer
    assert writer is not None
    alice = await hs.register("alice")
    own = f"/presence/{alice.user_id}/status"
    loop = asyncio.get_running_loop()

    async def presence() -> str:
        return str((await hs.ok("GET", own, token=alice.token))["presence"])

    # What a reader relays at a sync's start, then its USER_SYNC (and our own echo,
    # which the writer ignores: it counts its own syncs itself).
    await writer.set_state(alice.user_id, alice.device_id, "online", is_sync=True)
    now_ms = int(time.time() * 1000)
    writer.on_command(UserSyncCommand("reader", alice.user_id, alice.device_id, True, now_ms))
    writer.on_command(ClearUserSyncCommand(hs.config.instance_name))
    # Past the sync timeout (idle makes her unavailable meanwhile), never offline.
    until = loop.time() + SHORT.sync_timeout + 0.5
    while loop.time() < until:
        assert await presence() != "offline"
        await asyncio.sleep(0.1)  # sampling an invariant, not waiting for an event
    writer.on_command(ClearUserSyncCommand("reader"))
    cleared = loop.time()
    await wait_for(lambda: _is(presence, "offline"), 30, "alice offline after the clear")
    assert loop.time() - cleared >= SHORT.sync_timeout - 0.2


async def _is(read: Any, state: str) -> bool:
    return bool(await read() == state)


async def test_a_restarted_writer_times_out_the_users_it_restores(
    short_presence: Homeserver,
) -> None:
    """States stored as online come back at start and time out unless their user syncs."""
    hs = short_presence
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    store = hs.process.presence.store
    before = hs.process.presence.writer
    assert before is not None
    for user in (alice, bob):
        await before.set_state(user.user_id, user.device_id, "online", "here")
    before.close()
    restarted = PresenceWriter(store, presence_timeouts(SHORT), hs.config.instance_name)
    await restarted.start()
    try:
        for user in (alice, bob):
            assert restarted.machine.current(user.user_id).state == "online"
        await restarted.sync_started(bob.user_id, bob.device_id, "online")

        async def alice_offline() -> bool:
            return (await store.current([alice.user_id]))[alice.user_id].state == "offline"

        await wait_for(alice_offline, 30, "alice offline after the restart")
        now = await store.current([alice.user_id, bob.user_id])
        assert now[alice.user_id].status_msg == "here"  # kept while offline
        assert now[bob.user_id].state != "offline"  # still syncing
    finally:
        restarted.close()
