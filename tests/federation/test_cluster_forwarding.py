"""A federation listener that is not a room's events writer hands what changes the room to
the writer (:mod:`roomstream.federation.cluster`): each room's PDUs of a transaction, the
membership handshakes, invites. Both engines.

The "listener" and the "writer" are two :class:`FederationServer` s over one engine; the
listener's :class:`RoomOwners` names the writer as the owner of the rooms the test picks
and carries each call to it the way the internal API does (the request encoded to JSON
and parsed back, :data:`~roomstream.replication.endpoints.FEDERATION_ROOM`). The listener's
own receive path is made to fail, so whatever it persisted itself would show.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import orjson
from signedjson.types import SigningKey

from roomstream.config import Config
from roomstream.errors import ServiceUnavailableError
from roomstream.events.format import finalise_local_event
from roomstream.events.room_versions import room_version
from roomstream.federation.cluster import RoomOwners
from roomstream.federation.server import FederationServer
from roomstream.replication import endpoints as ep
from roomstream.rooms.engine import RoomEngine
from tests.support.federation import engine as engine  # fixture
from tests.support.federation import federation_client, remote_member_event
from tests.support.federation import remote_key as remote_key  # fixture
from tests.support.rooms import BOB, REMOTE, public_room, remote_join

V1 = "/_matrix/federation/v1"
V2 = "/_matrix/federation/v2"


def q(value: str) -> str:
    return quote(value, safe="")


class InProcessOwners(RoomOwners):
    """Rooms in ``owned`` are the writer's; calls reach it as over the internal API."""

    def __init__(self, writer: FederationServer | None, owned: set[str]) -> None:
        super().__init__(Config(server_name="test"), None)
        self.writer = writer
        self.owned = owned
        self.calls: list[tuple[str, str, dict[str, Any]]] = []

    def remote_owner(self, room_id: str) -> str | None:
        return "w2" if room_id in self.owned else None

    async def room_request(
        self, owner: str, room_id: str, origin: str, op: str, args: Mapping[str, Any]
    ) -> dict[str, Any]:
        call = ep.FederationRoomCall(room_id, origin, op, dict(args))
        wire = orjson.loads(orjson.dumps(ep.FEDERATION_ROOM.encode(call)))
        self.calls.append((op, room_id, wire["args"]))
        if self.writer is None:
            raise ServiceUnavailableError(f"{owner} is unreachable", retry_after_ms=1000)
        parsed = ep.FEDERATION_ROOM.parse(wire, {"room_id": room_id})
        answer = await self.writer.on_forwarded(parsed)
        return dict(orjson.loads(orjson.dumps(answer)))


class ListenerEngine:
    """The engine as the listener sees it: reads pass through; receiving does not."""

    def __init__(self, engine: RoomEngine) -> None:
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def receive_pdus(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the listener persisted an event itself")

    async def receive_out_of_band_membership(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the listener persisted an invite itself")


def listener(engine: RoomEngine, owners: InProcessOwners) -> FederationServer:
    return FederationServer(ListenerEngine(engine), owners=owners)  # type: ignore[arg-type]


async def test_each_rooms_pdus_go_to_its_writer_in_the_order_sent(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    owned_room = await public_room(engine)
    local_room = await public_room(engine)
    for room in (owned_room, local_room):
        join, _, _ = await remote_join(engine, remote_key, room)
        await engine.receive_pdus([join.raw])
    first = await remote_member_event(
        engine, remote_key, owned_room, BOB, "m.room.message", {"body": "one"}
    )
    second = await remote_member_event(
        engine,
        remote_key,
        owned_room,
        BOB,
        "m.room.message",
        {"body": "two"},
        prev_events=[first.event_id],
    )
    owners = InProcessOwners(FederationServer(engine), {owned_room})
    # The listener writes local_room: only its PDUs are received here (the real engine).
    server = FederationServer(engine, owners=owners)
    here = await remote_member_event(
        engine, remote_key, local_room, BOB, "m.room.message", {"body": "here"}
    )
    body = {"pdus": [dict(first.data), dict(here.data), dict(second.data)], "edus": []}
    async with federation_client(server) as fed:
        status, answer = await fed.call("PUT", f"{V1}/send/t1", body)
    assert status == 200, answer
    assert answer == {"pdus": {first.event_id: {}, second.event_id: {}, here.event_id: {}}}
    [(op, room, args)] = owners.calls
    assert (op, room) == ("pdus", owned_room)
    assert [p["content"]["body"] for p in args["pdus"]] == ["one", "two"]
    assert await engine.store.get_forward_extremities(owned_room) == [second.event_id]


async def test_the_writer_answers_for_the_listener_and_it_persists_nothing(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    room_id = await public_room(engine)
    owners = InProcessOwners(FederationServer(engine), {room_id})
    async with federation_client(listener(engine, owners)) as fed:
        status, made = await fed.call(
            "GET", f"{V1}/make_join/{q(room_id)}/{q(BOB)}", params=[("ver", "12")]
        )
        assert status == 200, made
        join = finalise_local_event(made["event"], room_version("12"), REMOTE, remote_key)
        status, answer = await fed.call(
            "PUT", f"{V2}/send_join/{q(room_id)}/{q(join.event_id)}", dict(join.data)
        )
        assert status == 200, answer
        assert answer["event"] == join.data and answer["origin"] == engine.server_name
        # The writer's refusal passes through as it was given.
        status, refused = await fed.call(
            "GET", f"{V1}/make_join/{q(room_id)}/{q('@eve:elsewhere.test')}", params=[("ver", "12")]
        )
        assert status == 403 and refused["errcode"] == "M_FORBIDDEN"
        message = await remote_member_event(
            engine, remote_key, room_id, BOB, "m.room.message", {"body": "hi"}
        )
        status, sent = await fed.call("PUT", f"{V1}/send/t2", {"pdus": [dict(message.data)]})
        assert (status, sent) == (200, {"pdus": {message.event_id: {}}})
    assert [op for op, _, _ in owners.calls] == ["make_join", "send_join", "make_join", "pdus"]
    assert await engine.store.get_membership(room_id, BOB) == "join"
    assert await engine.store.get_forward_extremities(room_id) == [message.event_id]


async def test_an_unreachable_writer_fails_the_transaction_so_that_it_is_sent_again(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    room_id = await public_room(engine)
    join, _, _ = await remote_join(engine, remote_key, room_id)
    await engine.receive_pdus([join.raw])
    message = await remote_member_event(
        engine, remote_key, room_id, BOB, "m.room.message", {"body": "later"}
    )
    down = InProcessOwners(None, {room_id})
    async with federation_client(listener(engine, down)) as fed:
        status, answer = await fed.call("PUT", f"{V1}/send/t3", {"pdus": [dict(message.data)]})
    assert status == 503 and answer["errcode"] == "M_UNAVAILABLE"
    assert await engine.store.get_event(message.event_id) is None
    # Not remembered as answered: the origin's retry, once the writer is back, lands.
    up = InProcessOwners(FederationServer(engine), {room_id})
    async with federation_client(listener(engine, up)) as fed:
        status, answer = await fed.call("PUT", f"{V1}/send/t3", {"pdus": [dict(message.data)]})
    assert (status, answer) == (200, {"pdus": {message.event_id: {}}})
    assert await engine.store.get_event(message.event_id) is not None
