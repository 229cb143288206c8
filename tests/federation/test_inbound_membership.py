"""Membership handshakes from other servers (fedinbound): make_join/send_join (v2) end to
end with a remote-signed join, make_leave/send_leave, make_knock/send_knock, and invites
of local users (v2), with their refusals. Both engines."""

from __future__ import annotations

from typing import Any

from signedjson.types import SigningKey

from roomstream.events.format import finalise_local_event
from roomstream.events.model import Event
from roomstream.events.room_versions import ROOM_V11, room_version
from roomstream.events.signing import check_event_signatures
from roomstream.federation.server import FederationServer
from roomstream.rooms.engine import RoomEngine
from tests.support.federation import V1, V2, federation_client, handshake, q
from tests.support.federation import engine as engine  # fixture
from tests.support.federation import remote_key as remote_key  # fixture
from tests.support.rooms import ALICE, BOB, REMOTE, SERVER, public_room, remote_event, remote_join


async def test_a_remote_user_joins_then_leaves(engine: RoomEngine, remote_key: SigningKey) -> None:
    room_id = await public_room(engine)
    state_before = await engine.store.get_current_state(room_id)
    async with federation_client(FederationServer(engine)) as fed:
        status, made = await fed.call(
            "GET", f"{V1}/make_join/{q(room_id)}/{q(BOB)}", params=[("ver", "11"), ("ver", "12")]
        )
        assert status == 200 and made["room_version"] == "12"
        template = made["event"]
        assert (template["type"], template["state_key"], template["content"]) == (
            "m.room.member",
            BOB,
            {"membership": "join"},
        )
        assert template["prev_events"] == await engine.store.get_forward_extremities(room_id)
        join, (status, answer) = await handshake(fed, remote_key, room_id, "join")
        assert status == 200, answer
        assert answer["event"] == join.data
        assert answer["members_omitted"] is False
        assert answer["servers_in_room"] == sorted([SERVER, REMOTE])
        ids = sorted(await _ids(engine, answer["state"]))
        assert ids == sorted(state_before.values())
        chain = await _ids(engine, answer["auth_chain"])
        assert state_before[("m.room.create", "")] in chain
        assert await engine.store.get_membership(room_id, BOB) == "join"
        assert await engine.store.get_forward_extremities(room_id) == [join.event_id]

        _, (status, answer) = await handshake(fed, remote_key, room_id, "leave")
        assert (status, answer) == (200, {})
        assert await engine.store.get_membership(room_id, BOB) == "leave"


async def test_join_refusals(engine: RoomEngine, remote_key: SigningKey) -> None:
    room_id = await public_room(engine)
    async with federation_client(FederationServer(engine)) as fed:
        # A version the remote server does not speak.
        status, answer = await fed.call(
            "GET", f"{V1}/make_join/{q(room_id)}/{q(BOB)}", params=[("ver", "10")]
        )
        assert (status, answer["errcode"], answer["room_version"]) == (
            400,
            "M_INCOMPATIBLE_ROOM_VERSION",
            "12",
        )
        # A user of another server.
        status, answer = await fed.call(
            "GET", f"{V1}/make_join/{q(room_id)}/{q(ALICE)}", params=[("ver", "12")]
        )
        assert (status, answer["errcode"]) == (403, "M_FORBIDDEN")
        # An unknown room.
        status, _ = await fed.call(
            "GET", f"{V1}/make_join/{q('!nope:x')}/{q(BOB)}", params=[("ver", "12")]
        )
        assert status == 404
        # A join sent under another event ID.
        status, made = await fed.call(
            "GET", f"{V1}/make_join/{q(room_id)}/{q(BOB)}", params=[("ver", "12")]
        )
        join = finalise_local_event(made["event"], room_version("12"), REMOTE, remote_key)
        status, answer = await fed.call(
            "PUT", f"{V2}/send_join/{q(room_id)}/{q('$other')}", dict(join.data)
        )
        assert status == 400
        assert await engine.store.get_membership(room_id, BOB) is None
        # An invite-only room: the rules refuse the join already at make_join.
        await engine.creator.create_event(
            room_id, ALICE, "m.room.join_rules", {"join_rule": "invite"}, state_key=""
        )
        status, answer = await fed.call(
            "GET", f"{V1}/make_join/{q(room_id)}/{q(BOB)}", params=[("ver", "12")]
        )
        assert (status, answer["errcode"]) == (403, "M_FORBIDDEN")
        # And send_join of the join made earlier is refused too (rejected by the rules).
        status, answer = await fed.call(
            "PUT", f"{V2}/send_join/{q(room_id)}/{q(join.event_id)}", dict(join.data)
        )
        assert (status, answer["errcode"]) == (403, "M_FORBIDDEN")
        assert await engine.store.get_membership(room_id, BOB) is None


async def test_a_remote_user_knocks(engine: RoomEngine, remote_key: SigningKey) -> None:
    room_id = await public_room(engine)
    await engine.creator.create_event(
        room_id, ALICE, "m.room.join_rules", {"join_rule": "knock"}, state_key=""
    )
    async with federation_client(FederationServer(engine)) as fed:
        _, (status, answer) = await handshake(fed, remote_key, room_id, "knock", send_version="v1")
    assert status == 200, answer
    stripped = {e["type"]: e for e in answer["knock_room_state"]}
    assert stripped["m.room.join_rules"]["content"] == {"join_rule": "knock"}
    assert stripped["m.room.name"]["content"] == {"name": "Lobby"}
    assert "m.room.create" in stripped
    assert await engine.store.get_membership(room_id, BOB) == "knock"


async def test_an_invite_of_a_local_user_is_counter_signed(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    room_id = "!elsewhere:remote.test"
    invite = remote_event(
        remote_key,
        ROOM_V11,
        room_id,
        BOB,
        "m.room.member",
        {"membership": "invite"},
        ["$prev"],
        ["$create", "$power", "$bob"],
        5,
        state_key=ALICE,
    )
    body = {"event": dict(invite.data), "room_version": "11", "invite_room_state": []}
    path = f"{V2}/invite/{q(room_id)}/{q(invite.event_id)}"
    async with federation_client(FederationServer(engine)) as fed:
        status, answer = await fed.call("PUT", path, body)
        assert status == 200, answer
        signed = answer["event"]
        assert set(signed["signatures"]) == {REMOTE, SERVER}
        ours = await engine.keys.verify_keys({SERVER, REMOTE})
        check_event_signatures(Event(signed, ROOM_V11, invite.event_id), ours)
        # Refusals: a version not spoken, an invite sent by another server's user, an
        # invite of a user not of this server.
        status, answer = await fed.call("PUT", path, {**body, "room_version": "9000"})
        assert (status, answer["errcode"]) == (400, "M_INCOMPATIBLE_ROOM_VERSION")
        status, answer = await fed.call("PUT", path, body, origin="elsewhere.test")
        assert (status, answer["errcode"]) == (403, "M_FORBIDDEN")
        not_ours = remote_event(
            remote_key,
            ROOM_V11,
            room_id,
            BOB,
            "m.room.member",
            {"membership": "invite"},
            ["$prev"],
            ["$create"],
            5,
            state_key="@dave:third.test",
        )
        status, answer = await fed.call(
            "PUT",
            f"{V2}/invite/{q(room_id)}/{q(not_ours.event_id)}",
            {**body, "event": dict(not_ours.data)},
        )
        assert status == 400


async def _ids(engine: RoomEngine, pdus: list[dict[str, Any]]) -> list[str]:
    from roomstream.events.hashing import compute_event_id

    return [compute_event_id(p, room_version("12")) for p in pdus]


async def test_a_restricted_join_is_authorised_by_a_local_user(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    space = await public_room(engine)
    outside = await public_room(engine)
    room_id = await public_room(engine)
    join_space, _, _ = await remote_join(engine, remote_key, space)
    [result] = await engine.receive_pdus([join_space.raw])
    assert result.rejected_reason is None
    await engine.creator.create_event(
        room_id,
        ALICE,
        "m.room.join_rules",
        {"join_rule": "restricted", "allow": [{"type": "m.room_membership", "room_id": space}]},
        state_key="",
    )
    await engine.creator.create_event(
        outside,
        ALICE,
        "m.room.join_rules",
        {"join_rule": "restricted", "allow": [{"type": "m.room_membership", "room_id": outside}]},
        state_key="",
    )
    async with federation_client(FederationServer(engine)) as fed:
        status, made = await fed.call(
            "GET", f"{V1}/make_join/{q(room_id)}/{q(BOB)}", params=[("ver", "12")]
        )
        assert status == 200
        assert made["event"]["content"]["join_authorised_via_users_server"] == ALICE
        _, (status, answer) = await handshake(fed, remote_key, room_id, "join")
        assert status == 200, answer
        # Counter-signed by this server, whose user authorised the join.
        assert set(answer["event"]["signatures"]) == {REMOTE, SERVER}
        assert await engine.store.get_membership(room_id, BOB) == "join"
        # Bob is in none of the rooms the other room's rule allows.
        status, answer = await fed.call(
            "GET", f"{V1}/make_join/{q(outside)}/{q(BOB)}", params=[("ver", "12")]
        )
        assert (status, answer["errcode"]) == (403, "M_FORBIDDEN")


async def test_an_invited_room_not_held_here_takes_no_pdus(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    room_id = "!elsewhere:remote.test"
    invite = remote_event(
        remote_key,
        ROOM_V11,
        room_id,
        BOB,
        "m.room.member",
        {"membership": "invite"},
        ["$prev"],
        ["$create"],
        5,
        state_key=ALICE,
    )
    message = remote_event(
        remote_key,
        ROOM_V11,
        room_id,
        BOB,
        "m.room.message",
        {"msgtype": "m.text", "body": "hi"},
        [invite.event_id],
        ["$create"],
        6,
    )
    async with federation_client(FederationServer(engine)) as fed:
        status, _ = await fed.call(
            "PUT",
            f"{V2}/invite/{q(room_id)}/{q(invite.event_id)}",
            {"event": dict(invite.data), "room_version": "11"},
        )
        assert status == 200
        assert await engine.store.get_membership(room_id, ALICE) == "invite"
        meta = await engine.store.get_meta([invite.event_id])
        assert meta[invite.event_id].outlier
        status, answer = await fed.call(
            "PUT", f"{V1}/send/t1", {"pdus": [dict(message.data)], "edus": []}
        )
    assert status == 200
    assert "not in" in answer["pdus"][message.event_id]["error"]
    assert await engine.store.get_event(message.event_id) is None


async def test_an_invite_into_a_room_held_here_is_a_plain_outlier(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    room_id = await public_room(engine)
    join, _, _ = await remote_join(engine, remote_key, room_id)
    await engine.receive_pdus([join.raw])
    current = await engine.store.get_current_state(room_id)
    invite = remote_event(
        remote_key,
        room_version("12"),
        room_id,
        BOB,
        "m.room.member",
        {"membership": "invite"},
        [join.event_id],
        [current[("m.room.power_levels", "")], join.event_id],
        join.depth + 1,
        state_key="@carol:local.test",
    )
    async with federation_client(FederationServer(engine)) as fed:
        status, _ = await fed.call(
            "PUT",
            f"{V2}/invite/{q(room_id)}/{q(invite.event_id)}",
            {"event": dict(invite.data), "room_version": "12"},
        )
    assert status == 200
    assert (await engine.store.get_meta([invite.event_id]))[invite.event_id].outlier
    # The room's state is its own: the invite arrives there through /send.
    assert await engine.store.get_current_state(room_id) == current
