"""Joining a room of another server (the joining side of make_join / send_join v2).

Server A (resident, SQLite) runs a real room engine behind the in-process fake of its
federation answers (tests/support/resident.py); server B (both engines) joins through
:class:`RemoteRoomsClient`, whose answer it checks and stores through its receive path.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from signedjson.types import SigningKey

from roomstream.config import DatabaseConfig
from roomstream.errors import AuthError, ForbiddenError, RemoteServerError
from roomstream.events.room_versions import room_version
from roomstream.events.signing import key_id, load_or_create_signing_key, sign_event
from roomstream.events.types import EventTypes
from roomstream.federation.remote_rooms import RemoteRoomsClient
from roomstream.reading import read_side_participants
from roomstream.rooms.creation import RoomPreset
from roomstream.rooms.engine import RoomEngine
from roomstream.storage import Database, connect, prepare_database
from roomstream.streams import StreamSet
from tests.support.resident import ResidentServer
from tests.support.rooms import verify_key_base64

A, B = "a.test", "b.test"
ALICE, BOB = "@alice:a.test", "@bob:b.test"


async def _engine(database: Database, name: str, key: SigningKey) -> RoomEngine:
    streams = await StreamSet.open(database, "main", {})
    return RoomEngine(database, streams, name, "main", key, participants=read_side_participants())


@pytest.fixture
async def servers(
    database: Database, tmp_path: Path
) -> AsyncIterator[tuple[RoomEngine, RoomEngine]]:
    """(A, B), each knowing the other's key."""
    key_a = load_or_create_signing_key(tmp_path / "a", A)
    key_b = load_or_create_signing_key(tmp_path / "b", B)
    db_a = connect(DatabaseConfig(engine="sqlite", path=str(tmp_path / "a.db")))
    await prepare_database(db_a)
    engine_a = await _engine(db_a, A, key_a)
    engine_b = await _engine(database, B, key_b)
    await engine_a.keys.add(B, key_id(key_b), verify_key_base64(key_b))
    await engine_b.keys.add(A, key_id(key_a), verify_key_base64(key_a))
    try:
        yield engine_a, engine_b
    finally:
        await engine_a.streams.flush()
        await db_a.close()


class Unreachable:
    async def request(self, method: str, destination: str, path: str, **_: Any) -> Any:
        raise ConnectionRefusedError(f"{destination} is down")


class Routed:
    """Requests to each destination go to its own fake."""

    def __init__(self, by_server: Mapping[str, Any]) -> None:
        self.by_server = by_server

    async def request(
        self,
        method: str,
        destination: str,
        path: str,
        *,
        query: Mapping[str, str | Sequence[str]] | None = None,
        content: object | None = None,
    ) -> Any:
        return await self.by_server[destination].request(
            method, destination, path, query=query, content=content
        )


def _client(engine_b: RoomEngine, requester: Any) -> RemoteRoomsClient:
    return RemoteRoomsClient(engine_b, engine_b.creator.signing_key, requester)


async def _room(engine: RoomEngine, preset: RoomPreset, version: str = "12") -> str:
    room_id, _ = await engine.creator.create_room(
        ALICE, version=version, preset=preset, name="Hall"
    )
    await engine.creator.create_event(room_id, ALICE, "m.room.message", {"body": "before"})
    return room_id


@pytest.mark.parametrize("version", ["10", "11", "12"])
async def test_join_stores_the_room_as_the_resident_has_it(
    servers: tuple[RoomEngine, RoomEngine], version: str
) -> None:
    engine_a, engine_b = servers
    room_id = await _room(engine_a, RoomPreset.PUBLIC_CHAT, version)
    resident = ResidentServer(engine_a)
    await _client(engine_b, resident).join(BOB, room_id, [A], {"displayname": "Bob"})

    # Both servers hold the same current state, Bob joined on both.
    state_a = await engine_a.store.get_current_state(room_id)
    state_b = await engine_b.store.get_current_state(room_id)
    assert state_b == state_a
    assert await engine_b.store.get_membership(room_id, BOB) == "join"
    assert await engine_b.store.joined_servers(room_id) == {A, B}
    join_id = state_b[(EventTypes.MEMBER, BOB)]
    assert await engine_b.store.get_forward_extremities(room_id) == [join_id]
    join = await engine_b.store.get_event(join_id)
    assert join is not None and join.content["displayname"] == "Bob"

    # B builds on the join; A accepts what B's user sends.
    sent = await engine_b.creator.create_event(room_id, BOB, "m.room.message", {"body": "hi"})
    assert sent.event.prev_event_ids == [join_id]
    [received] = await engine_a.receive_pdus([sent.event.raw])
    assert received.rejected_reason is None and not received.outlier
    assert not received.soft_failed

    # And B accepts what A's user sends after the join.
    reply = await engine_a.creator.create_event(room_id, ALICE, "m.room.message", {"body": "yo"})
    [back] = await engine_b.receive_pdus([reply.event.raw])
    assert back.rejected_reason is None and not back.outlier and not back.soft_failed


async def test_a_join_the_state_does_not_allow_is_refused(
    servers: tuple[RoomEngine, RoomEngine],
) -> None:
    """A resident that lies about the room (an invite-only room's state given for a
    join it let through) cannot make B store a join the rules refuse."""
    engine_a, engine_b = servers
    room_id = await _room(engine_a, RoomPreset.PUBLIC_CHAT)
    private = await _room(engine_a, RoomPreset.PRIVATE_CHAT)
    private_rules = await engine_a.store.get_current_state_entry(
        private, (EventTypes.JOIN_RULES, "")
    )
    assert private_rules is not None
    rules_event = await engine_a.store.get_event(private_rules)
    assert rules_event is not None
    resident = ResidentServer(engine_a)

    def swap_join_rules(answer: dict[str, Any]) -> None:
        # The private room's join rules are of another room: B must refuse them.
        for pdu in answer["state"]:
            if pdu["type"] == EventTypes.JOIN_RULES:
                pdu["content"] = {"join_rule": "invite"}

    resident.tamper = swap_join_rules
    with pytest.raises(RemoteServerError):
        # Changed content breaks the resident's signature: refused before anything else.
        await _client(engine_b, resident).join(BOB, room_id, [A], {})
    assert await engine_b.store.get_room_version(room_id) is None


async def test_a_join_refused_by_the_resident_is_passed_on(
    servers: tuple[RoomEngine, RoomEngine],
) -> None:
    engine_a, engine_b = servers
    room_id = await _room(engine_a, RoomPreset.PRIVATE_CHAT)
    with pytest.raises(ForbiddenError):
        await _client(engine_b, ResidentServer(engine_a)).join(BOB, room_id, [A], {})
    assert await engine_b.store.get_room_version(room_id) is None


async def test_the_next_server_is_tried_when_one_is_down(
    servers: tuple[RoomEngine, RoomEngine],
) -> None:
    engine_a, engine_b = servers
    room_id = await _room(engine_a, RoomPreset.PUBLIC_CHAT)
    resident = ResidentServer(engine_a)
    routed = Routed({"down.test": Unreachable(), A: resident})
    await _client(engine_b, routed).join(BOB, room_id, ["down.test", A], {})
    assert await engine_b.store.get_membership(room_id, BOB) == "join"


async def test_no_server_answering_is_a_bad_gateway(
    servers: tuple[RoomEngine, RoomEngine],
) -> None:
    _, engine_b = servers
    with pytest.raises(RemoteServerError) as caught:
        await _client(engine_b, Unreachable()).join(BOB, "!r:a.test", [A], {})
    assert caught.value.http_status == 502


async def test_a_template_for_someone_else_is_refused(
    servers: tuple[RoomEngine, RoomEngine],
) -> None:
    engine_a, engine_b = servers
    room_id = await _room(engine_a, RoomPreset.PUBLIC_CHAT)
    resident = ResidentServer(engine_a)
    real = resident._make_join

    async def other_user(room: str, user: str) -> dict[str, Any]:
        return await real(room, "@mallory:b.test")

    resident._make_join = other_user  # type: ignore[method-assign]
    with pytest.raises(RemoteServerError):
        await _client(engine_b, resident).join(BOB, room_id, [A], {})


async def test_remote_alias_resolves_through_its_server(
    servers: tuple[RoomEngine, RoomEngine],
) -> None:
    _, engine_b = servers

    class Directory:
        async def request(self, method: str, destination: str, path: str, **kw: Any) -> Any:
            assert (method, destination, path) == (
                "GET",
                A,
                "/_matrix/federation/v1/query/directory",
            )
            assert kw["query"] == {"room_alias": "#hall:a.test"}
            return {"room_id": "!r:a.test", "servers": ["c.test", A, 7]}

    room_id, via = await _client(engine_b, Directory()).resolve_alias("#hall:a.test")
    assert (room_id, via) == ("!r:a.test", [A, "c.test"])


class Invitee:
    """The invitee's server's answer to ``/invite`` v2: the event signed by it too
    (or, with ``sign=False``, unsigned: a server that never heard of it)."""

    def __init__(self, engine: RoomEngine, *, sign: bool = True) -> None:
        self.engine = engine
        self.sign = sign
        self.received: list[dict[str, Any]] = []

    async def request(
        self, method: str, destination: str, path: str, *, content: Any = None, **_: Any
    ) -> Any:
        assert (method, destination) == ("PUT", self.engine.server_name)
        assert path.startswith("/_matrix/federation/v2/invite/")
        self.received.append(content)
        event = dict(content["event"])
        if self.sign:
            version = room_version(content["room_version"])
            sign_event(event, destination, self.engine.creator.signing_key, room_version=version)
        return {"event": event}


async def test_an_invite_reaches_the_invitees_server_before_it_is_stored(
    servers: tuple[RoomEngine, RoomEngine],
) -> None:
    engine_a, engine_b = servers
    room_id = await _room(engine_a, RoomPreset.PRIVATE_CHAT)
    invitee = Invitee(engine_b)
    engine_a.creator.remote_invite = _client(engine_a, invitee).invite
    created = await engine_a.creator.create_event(
        room_id, ALICE, EventTypes.MEMBER, {"membership": "invite"}, state_key=BOB
    )
    [given] = invitee.received
    assert given["room_version"] == "12"
    shown = {(s["type"], s["state_key"]) for s in given["invite_room_state"]}
    assert (EventTypes.CREATE, "") in shown and (EventTypes.JOIN_RULES, "") in shown
    assert (EventTypes.MEMBER, ALICE) in shown
    assert await engine_a.store.get_membership(room_id, BOB) == "invite"
    stored = await engine_a.store.get_event(created.event.event_id)
    assert stored is not None and B in stored.data["signatures"]


async def test_an_invite_the_invitees_server_did_not_sign_is_not_stored(
    servers: tuple[RoomEngine, RoomEngine],
) -> None:
    engine_a, engine_b = servers
    room_id = await _room(engine_a, RoomPreset.PRIVATE_CHAT)
    engine_a.creator.remote_invite = _client(engine_a, Invitee(engine_b, sign=False)).invite
    with pytest.raises(RemoteServerError):
        await engine_a.creator.create_event(
            room_id, ALICE, EventTypes.MEMBER, {"membership": "invite"}, state_key=BOB
        )
    assert await engine_a.store.get_membership(room_id, BOB) is None


async def test_without_federation_a_remote_invite_is_refused(
    servers: tuple[RoomEngine, RoomEngine],
) -> None:
    engine_a, _ = servers
    room_id = await _room(engine_a, RoomPreset.PRIVATE_CHAT)
    with pytest.raises(AuthError):
        await engine_a.creator.create_event(
            room_id, ALICE, EventTypes.MEMBER, {"membership": "invite"}, state_key=BOB
        )
    assert await engine_a.store.get_membership(room_id, BOB) is None


async def test_a_join_after_a_remote_invite_resolves_forked_state_alike(
    servers: tuple[RoomEngine, RoomEngine], database: Database
) -> None:
    """B held Bob's invite (an out-of-band membership, stored when B knew nothing of the
    room) before joining: the join names it as an auth event, and Bob's later state
    events name the join. State resolution on B compares their auth chains, so once the
    room is held the invite enters the auth chain index (and its stored chains)."""
    engine_a, engine_b = servers
    room_id = await _room(engine_a, RoomPreset.PRIVATE_CHAT)
    engine_a.creator.remote_invite = _client(engine_a, Invitee(engine_b)).invite
    invite = await engine_a.creator.create_event(
        room_id, ALICE, EventTypes.MEMBER, {"membership": "invite"}, state_key=BOB
    )
    stored_invite = await engine_a.store.get_event(invite.event.event_id)
    assert stored_invite is not None
    await engine_b.receive_out_of_band_membership(stored_invite.raw, room_version("12"))
    await _client(engine_b, ResidentServer(engine_a)).join(BOB, room_id, [A], {})

    # A fork: Bob changes his member event on B while Alice sets the topic on A, both on
    # the join; each server then receives the other's event and resolves the two states.
    profile = await engine_b.creator.create_event(
        room_id, BOB, EventTypes.MEMBER, {"membership": "join", "displayname": "Bob"}, state_key=BOB
    )
    topic = await engine_a.creator.create_event(
        room_id, ALICE, EventTypes.TOPIC, {"topic": "forked"}, state_key=""
    )
    [on_b] = await engine_b.receive_pdus([topic.event.raw])
    [on_a] = await engine_a.receive_pdus([profile.event.raw])
    for result in (on_a, on_b):
        assert result.rejected_reason is None and not result.soft_failed and not result.outlier
    state_a = await engine_a.store.get_current_state(room_id)
    assert await engine_b.store.get_current_state(room_id) == state_a
    assert state_a[(EventTypes.TOPIC, "")] == topic.event.event_id
    assert state_a[(EventTypes.MEMBER, BOB)] == profile.event.event_id
    # The invite's chain is stored: a restarted B loads the same index.
    rows = await database.run_interaction(
        "invite_chain",
        lambda txn: txn.query(
            "SELECT chain_id FROM event_auth_chains WHERE event_id = ?",
            (invite.event.event_id,),
        ),
    )
    assert len(rows) == 1
