"""What the hot paths cost in database round trips, and the caches that make them cheap:
the access-token cache (invalidated by logouts, locally and from the ``caches`` stream)
and the ``/state`` answer cache."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from roomstream.accounts import Requester
from roomstream.accounts.token_cache import TOKEN_CACHE, TokenCache
from roomstream.accounts.tokens import token_hash
from roomstream.client import rooms as client_rooms
from roomstream.client.notifier import NOTIFIER_READ
from roomstream.storage import Database
from tests.support.client import room_with, send
from tests.support.e2e_keys import Device
from tests.support.homeserver import Homeserver, User, signal_waits
from tests.support.relations import relate

#: Background writes that fall into a window only by timing: the client IPs' batches and
#: the stream ID generators' stores of their positions.
BACKGROUND = {"flush_client_ips", "store_position"}


@contextmanager
def counted_round_trips(
    database: Database, *, with_notifier: bool = False, with_background: bool = False
) -> Iterator[list[str]]:
    """Names of the transactions run on ``database`` while the block runs, leaving out the
    background writes (:data:`BACKGROUND`) unless ``with_background`` and the notifier's
    reads of new rows (they serve waiting syncs, not the request) unless ``with_notifier``."""
    calls: list[str] = []
    original = database.run_interaction

    async def counting(name: str, func: Any, *args: Any, **kwargs: Any) -> Any:
        if (with_background or name not in BACKGROUND) and (with_notifier or name != NOTIFIER_READ):
            calls.append(name)
        return await original(name, func, *args, **kwargs)

    database.run_interaction = counting  # type: ignore[method-assign]
    try:
        yield calls
    finally:
        del database.run_interaction


async def test_a_send_costs_one_write(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    room = await homeserver.ok("POST", "/createRoom", {}, token=alice.token)
    path = f"/rooms/{room['room_id']}/send/m.room.message/"
    with counted_round_trips(homeserver.engine.db) as calls:
        await homeserver.ok("PUT", path + "warm", {"body": "0"}, token=alice.token)
    # The device's first send in the room loads its transaction IDs there.
    assert calls[0] == "transactions_of_device", calls
    await homeserver.engine.streams.flush()
    with counted_round_trips(homeserver.engine.db, with_background=True) as calls:
        sent = await homeserver.ok("PUT", path + "t1", {"body": "1"}, token=alice.token)
    # Only the event's write transaction, which stores the transaction ID too; the token
    # came from the cache. On SQLite (one connection) the stream position is stored in
    # that same transaction; on PostgreSQL in the background, coalescing sends.
    background = [c for c in calls if c == "store_position"]
    assert [c for c in calls if c not in background] == ["persist_events"], calls
    if homeserver.engine.db.engine_name == "sqlite":
        assert background == []
    with counted_round_trips(homeserver.engine.db) as calls:
        again = await homeserver.ok("PUT", path + "t1", {"body": "other"}, token=alice.token)
    assert again == sent
    assert calls == []


async def test_a_busy_devices_send_does_not_reload_its_transactions(
    homeserver: Homeserver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the transactions kept in memory, each send looks up its own transaction ID
    once: it does not read the device's transactions again (which cost every send of a
    bot with 10,000 messages in a room 10,001 rows)."""
    monkeypatch.setattr(client_rooms, "DEVICE_TRANSACTIONS_KEPT", 2)
    alice = await homeserver.register("alice")
    room = await homeserver.ok("POST", "/createRoom", {}, token=alice.token)
    path = f"/rooms/{room['room_id']}/send/m.room.message/"
    for i in range(4):
        await homeserver.ok("PUT", path + f"t{i}", {"body": str(i)}, token=alice.token)
    with counted_round_trips(homeserver.engine.db) as calls:
        sent = await homeserver.ok("PUT", path + "t9", {"body": "9"}, token=alice.token)
        again = await homeserver.ok("PUT", path + "t9", {"body": "x"}, token=alice.token)
    assert again == sent
    assert calls == ["event_for_transaction", "persist_events", "event_for_transaction"], calls


async def test_concurrent_retries_give_one_event(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    room_id = (await homeserver.ok("POST", "/createRoom", {}, token=alice.token))["room_id"]
    path = f"/rooms/{room_id}/send/m.room.message/"
    answers = await asyncio.gather(
        *(
            homeserver.ok("PUT", path + f"t{i % 3}", {"body": str(i)}, token=alice.token)
            for i in range(12)
        )
    )
    by_txn: dict[str, set[str]] = {}
    for i, answer in enumerate(answers):
        by_txn.setdefault(f"t{i % 3}", set()).add(answer["event_id"])
    assert all(len(ids) == 1 for ids in by_txn.values()), by_txn
    assert len(set.union(*by_txn.values())) == 3


@pytest.mark.parametrize("kept", [1, 10_000])
async def test_transaction_ids_survive_forgetting_and_restarts(
    homeserver: Homeserver, monkeypatch: pytest.MonkeyPatch, kept: int
) -> None:
    """A retry finds its event whether the device's transaction IDs are in memory, too
    many to keep (``kept``), or gone (another process took over: a fresh service)."""
    monkeypatch.setattr(client_rooms, "DEVICE_TRANSACTIONS_KEPT", kept)
    alice = await homeserver.register("alice")
    room_id = (await homeserver.ok("POST", "/createRoom", {}, token=alice.token))["room_id"]
    path = f"/rooms/{room_id}/send/m.room.message/"
    first = [
        (await homeserver.ok("PUT", path + f"t{i}", {"body": str(i)}, token=alice.token))[
            "event_id"
        ]
        for i in range(3)
    ]
    again = [
        (await homeserver.ok("PUT", path + f"t{i}", {"body": "x"}, token=alice.token))["event_id"]
        for i in range(3)
    ]
    assert again == first
    service = homeserver.process.rooms
    service._device_transactions.invalidate_all()
    requester = Requester(alice.user_id, alice.device_id)
    assert await service.send_event(requester, room_id, "m.room.message", {}, "t1") == first[1]
    # Another device's t1 is another transaction.
    other = Requester(alice.user_id, "OTHER")
    assert await service.send_event(requester, room_id, "m.room.message", {}, "t1") == first[1]
    assert await service.send_event(other, room_id, "m.room.message", {}, "t1") not in first


async def test_a_woken_sync_reads_only_the_new_events(homeserver: Homeserver) -> None:
    """Between a send and the waiting sync's answer: the send's write, one
    read of the new stream rows (which wakes the sync and brings the read path's change
    caches up to date), and the sync's one read of the events."""
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    room_id = (await homeserver.ok("POST", "/createRoom", {}, token=alice.token))["room_id"]
    await homeserver.ok(
        "POST", f"/rooms/{room_id}/invite", {"user_id": bob.user_id}, token=alice.token
    )
    await homeserver.ok("POST", f"/rooms/{room_id}/join", {}, token=bob.token)
    await homeserver.ok(  # alice's first send in the room loads her transaction IDs
        "PUT", f"/rooms/{room_id}/send/m.room.message/w0", {"body": "0"}, token=alice.token
    )
    since = (await homeserver.ok("GET", "/sync?timeout=0", token=bob.token))["next_batch"]
    await homeserver.engine.streams.flush()
    # Counting starts once the sync has read, found nothing and waits (its first read's
    # transactions, key counts included, must not fall into the window).
    sync_waits = signal_waits(homeserver)
    waiting = asyncio.create_task(
        homeserver.ok("GET", f"/sync?timeout=30000&since={since}", token=bob.token)
    )
    await sync_waits.wait()
    with counted_round_trips(homeserver.engine.db, with_notifier=True) as calls:
        await homeserver.ok(
            "PUT", f"/rooms/{room_id}/send/m.room.message/w", {"body": "hi"}, token=alice.token
        )
        answer = await waiting
    bodies = [
        e["content"].get("body") for e in answer["rooms"]["join"][room_id]["timeline"]["events"]
    ]
    assert bodies == ["hi"]
    assert calls == [
        "persist_events",
        NOTIFIER_READ,
        "sync_timelines",
        # The device's one-time key counts and fallback key types, in one transaction:
        # other users' claims change them without a stream row, so every sync reads them
        # (as Synapse does).
        "e2e_key_status",
        # bob's unread count changed with the message: one statement for the counts of
        # the rooms with new events (client/unread.py), not one per room.
        "unread_counts",
    ], calls


async def test_a_sync_woken_by_a_to_device_message_reads_once(homeserver: Homeserver) -> None:
    """Between ``PUT /sendToDevice`` and the waiting sync's answer: the send's write, the
    notifier's read of the new row, and one transaction of the woken sync, which takes
    the device's messages and its key status (one-time key counts, fallback key types)
    together; the key status is the current one (a claim since the last sync shows)."""
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    otks = Device(bob.user_id, bob.device_id).one_time_keys(["1", "2", "3"])
    fallback = {"signed_curve25519:F": {"key": "f", "fallback": True}}
    body = {"one_time_keys": otks, "fallback_keys": fallback}
    await homeserver.ok("POST", "/keys/upload", body, token=bob.token)
    first = await homeserver.ok("GET", "/sync?timeout=0", token=bob.token)
    assert first["device_one_time_keys_count"] == {"signed_curve25519": 3}
    claim = {"one_time_keys": {bob.user_id: {bob.device_id: "signed_curve25519"}}}
    await homeserver.ok("POST", "/keys/claim", claim, token=alice.token)
    await homeserver.engine.streams.flush()
    waits = signal_waits(homeserver)
    waiting = asyncio.create_task(
        homeserver.ok("GET", f"/sync?timeout=30000&since={first['next_batch']}", token=bob.token)
    )
    await waits.wait()
    message = {"messages": {bob.user_id: {bob.device_id: {"n": 1}}}}
    with counted_round_trips(homeserver.engine.db, with_notifier=True) as calls:
        await homeserver.ok("PUT", "/sendToDevice/m.test/t1", message, token=alice.token)
        answer = await waiting
    assert [e["content"] for e in answer["to_device"]["events"]] == [{"n": 1}]
    assert answer["device_one_time_keys_count"] == {"signed_curve25519": 2}
    assert answer["device_unused_fallback_key_types"] == ["signed_curve25519"]
    assert calls == ["send_to_device", NOTIFIER_READ, "to_device_messages"], calls


async def test_transaction_id_is_stored_with_the_event(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    room_id = (await homeserver.ok("POST", "/createRoom", {}, token=alice.token))["room_id"]
    sent = await homeserver.ok(
        "PUT", f"/rooms/{room_id}/send/m.room.message/abc", {"body": "x"}, token=alice.token
    )
    rows = await homeserver.engine.db.run_interaction(
        "test_query",
        lambda t: t.query(
            "SELECT e.event_id, x.device_id, x.txn_id FROM events e"
            " JOIN event_txn_ids x ON x.event_id = e.event_id WHERE x.txn_id = ?",
            ("abc",),
        ),
    )
    assert [tuple(r) for r in rows] == [(sent["event_id"], alice.device_id, "abc")]


async def test_send_by_a_non_member_is_forbidden(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    room_id = (await homeserver.ok("POST", "/createRoom", {}, token=alice.token))["room_id"]
    status, body = await homeserver.call(
        "PUT", f"/rooms/{room_id}/send/m.room.message/t", {"body": "x"}, token=bob.token
    )
    assert (status, body["errcode"]) == (403, "M_FORBIDDEN")
    # Nothing was recorded for the refused transaction: a retry after joining sends.
    await homeserver.ok(
        "POST", f"/rooms/{room_id}/invite", {"user_id": bob.user_id}, token=alice.token
    )
    await homeserver.ok("POST", f"/rooms/{room_id}/join", {}, token=bob.token)
    await homeserver.ok(
        "PUT", f"/rooms/{room_id}/send/m.room.message/t", {"body": "x"}, token=bob.token
    )


async def test_state_is_one_read_and_follows_changes(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    room_id = (await homeserver.ok("POST", "/createRoom", {"name": "one"}, token=alice.token))[
        "room_id"
    ]
    first = await homeserver.ok("GET", f"/rooms/{room_id}/state", token=alice.token)
    with counted_round_trips(homeserver.engine.db) as calls:
        assert await homeserver.ok("GET", f"/rooms/{room_id}/state", token=alice.token) == first
    assert len(calls) == 1, calls
    # A state change (which could equally arrive from another writer) shows at once.
    await homeserver.ok(
        "PUT", f"/rooms/{room_id}/state/m.room.name/", {"name": "two"}, token=alice.token
    )
    after = await homeserver.ok("GET", f"/rooms/{room_id}/state", token=alice.token)
    names = [e["content"]["name"] for e in after if e["type"] == "m.room.name"]
    assert names == ["two"]
    assert len(after) == len(first)
    # After leaving: the state at the leave (spec), never the cached answer of before.
    await homeserver.ok("POST", f"/rooms/{room_id}/leave", {}, token=alice.token)
    left = await homeserver.ok("GET", f"/rooms/{room_id}/state", token=alice.token)
    mine = [e["content"] for e in left if e["type"] == "m.room.member"]
    assert mine == [{"membership": "leave"}]
    # A stranger still may not read it.
    bob = await homeserver.register("bob")
    status, body = await homeserver.call("GET", f"/rooms/{room_id}/state", token=bob.token)
    assert (status, body["errcode"]) == (403, "M_FORBIDDEN")


async def test_logout_ends_cached_tokens_and_streams_the_invalidation(
    homeserver: Homeserver,
) -> None:
    alice = await homeserver.register("alice")
    await homeserver.ok("GET", "/account/whoami", token=alice.token)
    cache = homeserver.process.token_cache
    assert cache is not None and cache.get(token_hash(alice.token)) is not None
    with counted_round_trips(homeserver.engine.db) as calls:
        await homeserver.ok("GET", "/account/whoami", token=alice.token)
    assert calls == []
    await homeserver.ok("POST", "/logout", {}, token=alice.token)
    status, body = await homeserver.call("GET", "/account/whoami", token=alice.token)
    assert (status, body["errcode"]) == (401, "M_UNKNOWN_TOKEN")
    rows = await homeserver.engine.db.run_interaction(
        "test_query", lambda t: t.query("SELECT cache_func, keys FROM cache_invalidations")
    )
    assert [tuple(r) for r in rows] == [(TOKEN_CACHE, f'["{alice.user_id}"]')]


async def test_a_replicated_invalidation_ends_a_cached_token(homeserver: Homeserver) -> None:
    """Another process logged the device out: its deletion is in the database, and this
    process stops accepting the token when the ``caches`` row arrives."""
    alice = await homeserver.register("alice")
    await homeserver.ok("GET", "/account/whoami", token=alice.token)
    await homeserver.process.accounts.store.delete_device(alice.user_id, alice.device_id)
    # Still cached here (the other process's row has not arrived)...
    await homeserver.ok("GET", "/account/whoami", token=alice.token)
    homeserver.process.on_replicated_rows("caches", "other", 1, [[TOKEN_CACHE, [alice.user_id], 0]])
    status, body = await homeserver.call("GET", "/account/whoami", token=alice.token)
    assert (status, body["errcode"]) == (401, "M_UNKNOWN_TOKEN")


def test_token_cache_ignores_reads_that_raced_an_invalidation() -> None:
    cache = TokenCache(max_size=2)
    generation = cache.generation
    cache.invalidate_user("@a:x")  # a logout applied while a read was in flight
    cache.put("h1", ("@a:x", "D"), generation)
    assert cache.get("h1") is None
    cache.put("h1", ("@a:x", "D"), cache.generation)
    cache.put("h2", ("@b:x", "E"), cache.generation)
    cache.put("h3", ("@b:x", "F"), cache.generation)  # evicts h1 (least recently used)
    assert (cache.get("h1"), len(cache)) == (None, 2)
    cache.apply_cache_row(["other_cache", ["@b:x"], 0])
    assert cache.get("h2") is not None
    cache.apply_cache_row([TOKEN_CACHE, ["@b:x"], 0])
    assert cache.get("h2") is None and cache.get("h3") is None
    cache.put("h4", ("@c:x", "G"), cache.generation)
    cache.apply_cache_row([TOKEN_CACHE, None, 0])
    assert len(cache) == 0


async def test_rows_handed_to_the_read_path_must_leave_no_gap(homeserver: Homeserver) -> None:
    """The notifier's rows feed the read path's change caches only when they continue
    what it has: a batch after a gap is refused (the next sync reads the rows itself)."""
    alice = await homeserver.register("alice")
    await homeserver.ok("GET", "/sync?timeout=0", token=alice.token)  # reader caught up
    reader = homeserver.process.reader
    writer = homeserver.config.instance_name
    have = reader.changes.ingested[writer]
    row = (
        "ev",
        ("$e", "!room", "m.room.member", "@x:test.local", None, None, "join", False, False),
    )
    assert not reader.ingest_rows(writer, have + 1, have + 2, [(have + 2, row)])
    assert reader.changes.ingested[writer] == have
    assert not reader.changes.member_changes.has_entity_changed("@x:test.local", have)
    assert reader.ingest_rows(writer, have, have + 2, [(have + 2, row)])
    assert reader.changes.ingested[writer] == have + 2
    assert reader.changes.member_changes.has_entity_changed("@x:test.local", have)
    assert reader.changes.room_changes.has_entity_changed("!room", have)


async def _twin_rooms(hs: Homeserver) -> tuple[tuple[User, str], tuple[User, str], str]:
    """Two rooms of the same shape, each with its own second member: one of plain
    messages, one whose messages have relations (a thread, a reference, a reaction).
    ((plain member, room), (related member, room), the thread root)."""
    alice, plain_user, related_user = [await hs.register(n) for n in ("alice", "pat", "rel")]
    plain_room = await room_with(hs, alice, plain_user)
    related_room = await room_with(hs, alice, related_user)
    for i in range(3):
        await send(hs, alice, plain_room, f"plain {i}")
    root = await send(hs, alice, related_room, "root")
    await relate(hs, related_user, related_room, "m.thread", root, body="reply")
    await relate(hs, related_user, related_room, "m.reference", root)
    await relate(
        hs, related_user, related_room, "m.annotation", root, event_type="m.reaction", key="+1"
    )
    return (plain_user, plain_room), (related_user, related_room), root


async def test_messages_with_relations_cost_no_more_round_trips(homeserver: Homeserver) -> None:
    """A ``/messages`` page whose events have relations reads their aggregations in the
    page's own transaction: the same transactions as a page without any."""
    hs = homeserver
    (plain_user, plain_room), (related_user, related_room), root = await _twin_rooms(hs)
    path = "/rooms/{}/messages?dir=b&limit=20"
    for user, room in ((plain_user, plain_room), (related_user, related_room)):
        await hs.ok("GET", path.format(room), token=user.token)  # warm the token cache
    with counted_round_trips(hs.engine.db) as plain:
        await hs.ok("GET", path.format(plain_room), token=plain_user.token)
    with counted_round_trips(hs.engine.db) as related:
        page = await hs.ok("GET", path.format(related_room), token=related_user.token)
    assert related == plain == ["paginate"], (plain, related)
    bundle = next(e for e in page["chunk"] if e["event_id"] == root)["unsigned"]["m.relations"]
    assert bundle["m.thread"]["count"] == 1 and len(bundle["m.reference"]["chunk"]) == 1
    # /context, /relations and /threads likewise: one transaction each, the read's own
    # (the root, served by /context and /threads, comes with its bundle).
    reads = {
        f"/rooms/{related_room}/context/{root}?limit=10": "event_context",
        f"/rooms/{related_room}/relations/{root}": "relations",
        f"/rooms/{related_room}/threads": "threads",
    }
    for path, name in reads.items():
        with counted_round_trips(hs.engine.db) as calls:
            answer = await hs.ok("GET", path, token=related_user.token)
        assert calls == [name], (path, calls)
        served = {e["event_id"]: e for e in answer.get("chunk") or [answer["event"]]}
        if root in served:
            assert served[root]["unsigned"]["m.relations"]["m.thread"]["count"] == 1, path


async def test_initial_sync_with_relations_costs_no_more_round_trips(
    homeserver: Homeserver,
) -> None:
    """An initial ``/sync`` reads the timelines' aggregations with the timelines: the
    same transactions for a room with relations as for one without (sliding sync's
    first response likewise)."""
    hs = homeserver
    (plain_user, _), (related_user, _), root = await _twin_rooms(hs)
    for user in (plain_user, related_user):
        await hs.ok("GET", "/sync", token=user.token)  # warm the per-user caches
    with counted_round_trips(hs.engine.db) as plain:
        await hs.ok("GET", "/sync", token=plain_user.token)
    with counted_round_trips(hs.engine.db) as related:
        answer = await hs.ok("GET", "/sync", token=related_user.token)
    assert related == plain, (plain, related)
    assert "relation_aggregations" not in related
    events = [e for room in answer["rooms"]["join"].values() for e in room["timeline"]["events"]]
    root_event = next(e for e in events if e["event_id"] == root)
    assert root_event["unsigned"]["m.relations"]["m.thread"]["count"] == 1

    body = {"lists": {"all": {"ranges": [[0, 9]], "timeline_limit": 10}}}
    path = "/_matrix/client/unstable/org.matrix.simplified_msc3575/sync"
    with counted_round_trips(hs.engine.db) as sliding:
        first = await hs.ok("POST", path, body, token=related_user.token)
    assert "relation_aggregations" not in sliding, sliding
    timeline = next(iter(first["rooms"].values()))["timeline"]
    root_event = next(e for e in timeline if e["event_id"] == root)
    assert root_event["unsigned"]["m.relations"]["m.thread"]["count"] == 1
