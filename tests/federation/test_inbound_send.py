"""``PUT /send/{txnId}`` (fedinbound): idempotent per (origin, txnId), the origin check,
signatures, soft failure, the server ACL, limits, EDUs, rooms processed independently,
and a fuzzed body never answered 5xx. Both engines."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from signedjson.key import decode_signing_key_base64
from signedjson.types import SigningKey

from roomstream.events.model import Event
from roomstream.federation.server import FederationServer
from roomstream.rooms.engine import RoomEngine
from tests.support.federation import (
    SEND,
    FakeFederationClient,
    federation_client,
    joined_room,
    remote_member_event,
    txn,
)
from tests.support.federation import engine as engine  # fixture
from tests.support.federation import remote_key as remote_key  # fixture
from tests.support.rooms import ALICE, BOB, REMOTE
from tests.support.wait import wait_for


async def message(engine: RoomEngine, key: SigningKey, room_id: str, body: str) -> Event:
    return await remote_member_event(
        engine, key, room_id, BOB, "m.room.message", {"msgtype": "m.text", "body": body}
    )


class RecordingEdus:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, Mapping[str, Any]]] = []

    async def on_edu(self, origin: str, edu_type: str, content: Mapping[str, Any]) -> None:
        if edu_type == "boom":
            raise RuntimeError("a failing EDU handler")
        self.seen.append((origin, edu_type, content))


async def test_a_transaction_is_processed_once_per_origin_and_id(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    room_id = await joined_room(engine, remote_key)
    first = await message(engine, remote_key, room_id, "one")
    server = FederationServer(engine)
    async with federation_client(server) as fed:
        status, answer = await fed.call("PUT", SEND + "t1", txn(first))
        assert (status, answer) == (200, {"pdus": {first.event_id: {}}})
        assert await engine.store.get_forward_extremities(room_id) == [first.event_id]
        # A retry with other content is not processed: it gets the first answer.
        second = await message(engine, remote_key, room_id, "two")
        status, again = await fed.call("PUT", SEND + "t1", txn(second))
        assert (status, again) == (200, answer)
        assert await engine.store.get_event(second.event_id) is None
        # The same ID from another origin is another transaction.
        status, other = await fed.call("PUT", SEND + "t1", txn(), origin="elsewhere.test")
        assert (status, other) == (200, {"pdus": {}})
        # And concurrent retries are answered once too.
        answers = await asyncio.gather(
            *(fed.call("PUT", SEND + "t2", txn(second)) for _ in range(3))
        )
        assert answers == [(200, {"pdus": {second.event_id: {}}})] * 3


async def test_pdus_whose_sender_is_not_of_the_origin_are_dropped(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    room_id = await joined_room(engine, remote_key)
    good = await message(engine, remote_key, room_id, "fine")
    forged = await remote_member_event(
        engine, remote_key, room_id, ALICE, "m.room.message", {"msgtype": "m.text", "body": "x"}
    )
    async with federation_client(FederationServer(engine)) as fed:
        status, answer = await fed.call("PUT", SEND + "t", txn(good, forged))
    assert status == 200
    assert answer["pdus"][good.event_id] == {}
    assert "not of the origin" in answer["pdus"][forged.event_id]["error"]
    assert await engine.store.get_event(forged.event_id) is None
    assert await engine.store.get_event(good.event_id) is not None


async def test_a_bad_signature_is_an_error_for_that_pdu_only(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    room_id = await joined_room(engine, remote_key)
    unknown_key = decode_signing_key_base64(
        "ed25519", "other", "YJDBA9Xnr2sVqXD9Vj7XVUnmFZcZrlw8Md7kMW+3XA1"
    )
    good = await message(engine, remote_key, room_id, "signed")
    bad = await message(engine, unknown_key, room_id, "forged")
    tampered = dict(good.data)
    tampered["origin_server_ts"] = 2  # the signature no longer matches
    async with federation_client(FederationServer(engine)) as fed:
        status, answer = await fed.call(
            "PUT", SEND + "t", {"pdus": [dict(bad.data), dict(good.data)], "edus": []}
        )
        assert status == 200
        assert "error" in answer["pdus"][bad.event_id]
        assert answer["pdus"][good.event_id] == {}
        status, answer = await fed.call("PUT", SEND + "t2", {"pdus": [tampered]})
    assert status == 200
    [(tampered_id, outcome)] = answer["pdus"].items()
    assert "error" in outcome and tampered_id != good.event_id
    assert await engine.store.get_event(bad.event_id) is None
    assert await engine.store.get_event(tampered_id) is None


async def test_an_event_the_current_state_forbids_is_soft_failed(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    room_id = await joined_room(engine, remote_key)
    before_ban = await engine.store.get_forward_extremities(room_id)
    _, _, state_before_ban = await engine.persister.get_room_state(room_id)
    await engine.creator.create_event(
        room_id, ALICE, "m.room.member", {"membership": "ban"}, state_key=BOB
    )
    # Bob's message on the state before his ban: allowed there, not now.
    late = await remote_member_event(
        engine,
        remote_key,
        room_id,
        BOB,
        "m.room.message",
        {"msgtype": "m.text", "body": "too late"},
        prev_events=before_ban,
        auth_state=state_before_ban,
    )
    async with federation_client(FederationServer(engine)) as fed:
        status, answer = await fed.call("PUT", SEND + "t", txn(late))
    assert (status, answer) == (200, {"pdus": {late.event_id: {}}})
    meta = (await engine.store.get_meta([late.event_id]))[late.event_id]
    assert meta.soft_failed and meta.rejected_reason is None
    assert late.event_id not in await engine.store.get_forward_extremities(room_id)


async def test_the_server_acl_denies_a_server(engine: RoomEngine, remote_key: SigningKey) -> None:
    room_id = await joined_room(engine, remote_key)
    await engine.creator.create_event(
        room_id, ALICE, "m.room.server_acl", {"allow": ["*"], "deny": ["remote.test"]}, state_key=""
    )
    denied = await message(engine, remote_key, room_id, "denied")
    async with federation_client(FederationServer(engine)) as fed:
        status, answer = await fed.call("PUT", SEND + "t", txn(denied))
    assert status == 200
    assert "ACL" in answer["pdus"][denied.event_id]["error"]
    assert await engine.store.get_event(denied.event_id) is None


async def test_limits_and_edus(engine: RoomEngine, remote_key: SigningKey) -> None:
    edus = RecordingEdus()
    async with federation_client(FederationServer(engine, edus=edus)) as fed:
        status, answer = await fed.call("PUT", SEND + "big", {"pdus": [{}] * 51})
        assert status == 400 and answer["errcode"] == "M_TOO_LARGE"
        status, answer = await fed.call("PUT", SEND + "big2", {"edus": [{}] * 101})
        assert status == 400
        body = {
            "pdus": [],
            "edus": [
                {"edu_type": "m.typing", "content": {"room_id": "!r:x", "typing": True}},
                {"edu_type": "boom", "content": {}},
                {"edu_type": "m.presence", "content": {"push": []}},
                "not an edu",
            ],
        }
        status, answer = await fed.call("PUT", SEND + "edus", body)
        assert (status, answer) == (200, {"pdus": {}})
        assert [(o, t) for o, t, _ in edus.seen] == [(REMOTE, "m.typing"), (REMOTE, "m.presence")]
        status, _ = await fed.call("PUT", SEND + "anon", body, origin="")
        assert status == 401


class BlockingClient(FakeFederationClient):
    """get_missing_events blocks until released: a room whose processing is slow."""

    def __init__(self) -> None:
        super().__init__(missing=[])
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def request(self, method: str, destination: str, path: str, **kw: Any) -> Any:
        if "/get_missing_events/" in path:
            self.entered.set()
            await self.release.wait()
        return await super().request(method, destination, path, **kw)


async def test_a_slow_room_never_stalls_another(engine: RoomEngine, remote_key: SigningKey) -> None:
    slow_room = await joined_room(engine, remote_key)
    fast_room = await joined_room(engine, remote_key)
    # A message in the slow room whose prev event is unknown: its gap is being filled.
    gap = await remote_member_event(
        engine,
        remote_key,
        slow_room,
        BOB,
        "m.room.message",
        {"msgtype": "m.text", "body": "after a gap"},
        prev_events=["$unknown-prev-event"],
    )
    client = BlockingClient()
    current = await engine.store.get_current_state(slow_room)
    client.states["$unknown-prev-event"] = sorted(current.values())
    client.add(*(await engine.store.get_events(current.values())).values())
    fast_messages = [await message(engine, remote_key, fast_room, f"m{i}") for i in range(1)]
    server = FederationServer(engine, client=client)
    async with federation_client(server) as fed:
        slow = asyncio.create_task(fed.call("PUT", SEND + "slow", txn(gap)))
        await wait_for(client.entered.is_set, what="the slow room's gap filling")
        # Another origin's transaction for another room completes meanwhile...
        status, answer = await fed.call("PUT", SEND + "fast", txn(*fast_messages))
        assert (status, answer) == (200, {"pdus": {fast_messages[0].event_id: {}}})
        assert not slow.done()
        # ...and so does the other room within one transaction with the slow one.
        second = await message(engine, remote_key, fast_room, "same txn")
        both = asyncio.create_task(fed.call("PUT", SEND + "both", txn(gap, second)))
        await wait_for(
            lambda: engine.store.have_events([second.event_id]), what="the fast room's event"
        )
        assert not both.done()
        client.release.set()
        status, answer = await slow
        assert status == 200
        assert await both == (200, {"pdus": {gap.event_id: {}, second.event_id: {}}})


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
pdu_like = st.fixed_dictionaries(
    {},
    optional={
        "room_id": st.sampled_from(["!nope:x", "ROOM"]) | st.text(max_size=3),
        "type": st.sampled_from(["m.room.message", "m.room.member"]) | json_values,
        "sender": st.sampled_from([BOB, "@x:elsewhere"]) | json_values,
        "content": json_values,
        "prev_events": json_values,
        "auth_events": json_values,
        "depth": st.integers(min_value=-(2**70), max_value=2**70) | json_values,
        "event_id": json_values,
    },
)
bodies = st.fixed_dictionaries(
    {},
    optional={
        "pdus": st.lists(pdu_like | json_values, max_size=4) | json_values,
        "edus": st.lists(json_values, max_size=3) | json_values,
        "origin": json_values,
    },
)


async def test_fuzzed_transactions_are_never_answered_5xx(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    room_id = await joined_room(engine, remote_key)
    seen: list[Any] = []

    @settings(
        max_examples=150,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(bodies)
    def collect(body: Any) -> None:
        seen.append(body)

    collect()
    async with federation_client(FederationServer(engine)) as fed:
        for i, body in enumerate(seen):
            if isinstance(body.get("pdus"), list):
                body["pdus"] = [
                    {**p, "room_id": room_id}
                    if isinstance(p, dict) and p.get("room_id") == "ROOM"
                    else p
                    for p in body["pdus"]
                ]
            status, answer = await fed.call("PUT", SEND + f"fuzz{i}", body)
            assert status < 500, (body, answer)
        status, _ = await fed.call("PUT", SEND + "notjson", raw=b"{nope")
        assert status == 400
        status, _ = await fed.call("PUT", SEND + "array", raw=b"[]")
        assert status == 400


async def test_fuzzed_bodies_of_the_other_routes_are_never_answered_5xx(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    room_id = await joined_room(engine, remote_key)
    [tip] = await engine.store.get_forward_extremities(room_id)
    seen: list[Any] = []

    @settings(
        max_examples=60,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(pdu_like, json_values)
    def collect(pdu: Any, other: Any) -> None:
        seen.append((pdu, other))

    collect()
    routes = [
        f"/_matrix/federation/v2/send_join/{room_id}/{tip}",
        f"/_matrix/federation/v2/send_leave/{room_id}/{tip}",
        f"/_matrix/federation/v1/send_knock/{room_id}/{tip}",
        f"/_matrix/federation/v2/invite/{room_id}/{tip}",
    ]
    async with federation_client(FederationServer(engine)) as fed:
        for i, (pdu, other) in enumerate(seen):
            pdu = {**pdu, "room_id": room_id} if pdu.get("room_id") == "ROOM" else pdu
            path = routes[i % len(routes)]
            body = (
                {"event": pdu, "room_version": other if i % 2 else "12"}
                if "invite" in path
                else pdu
            )
            status, answer = await fed.call("PUT", path.replace("!", "%21"), body)
            assert status < 500, (path, body, answer)
            missing = {"earliest_events": other, "latest_events": [tip], "limit": other}
            status, answer = await fed.call(
                "POST", f"/_matrix/federation/v1/get_missing_events/{room_id}", missing
            )
            assert status < 500, (missing, answer)
            status, answer = await fed.call(
                "GET",
                f"/_matrix/federation/v1/backfill/{room_id}",
                params={"v": str(other)[:50], "limit": str(other)[:5]},
            )
            assert status < 500, (other, answer)
