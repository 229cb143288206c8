"""What a local user's /sync shows of what arrives over federation (fedinbound): a
remote user's join through make_join/send_join and his message through /send appear in
the room's timeline and state. Both engines, the full Client-Server API in process."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

from signedjson.types import SigningKey

from roomstream.events.room_versions import ROOM_V11
from roomstream.events.signing import key_id
from roomstream.federation.server import FederationServer
from roomstream.storage import DatabaseConfig
from tests.support.federation import SEND, federation_client, handshake, remote_member_event, txn
from tests.support.federation import remote_key as remote_key  # fixture
from tests.support.homeserver import make_config, serve_homeserver
from tests.support.rooms import BOB, REMOTE, remote_event, verify_key_base64


async def test_a_remote_join_and_message_show_in_sync(
    db_config: DatabaseConfig, tmp_path: Path, remote_key: SigningKey
) -> None:
    async with serve_homeserver(make_config(db_config, tmp_path)) as hs:
        alice = await hs.register("alice")
        created = await hs.ok("POST", "/createRoom", {"preset": "public_chat"}, token=alice.token)
        room_id = created["room_id"]
        await hs.engine.keys.add(REMOTE, key_id(remote_key), verify_key_base64(remote_key))
        first = await hs.ok("GET", "/sync", token=alice.token)
        async with federation_client(FederationServer(hs.engine)) as fed:
            join, (status, _) = await handshake(fed, remote_key, room_id, "join")
            assert status == 200
            hello = await remote_member_event(
                hs.engine,
                remote_key,
                room_id,
                BOB,
                "m.room.message",
                {"msgtype": "m.text", "body": "hello from afar"},
            )
            status, answer = await fed.call("PUT", SEND + "t1", txn(hello))
            assert (status, answer) == (200, {"pdus": {hello.event_id: {}}})
        since = first["next_batch"]
        sync = await hs.ok("GET", f"/sync?since={since}&timeout=0", token=alice.token)
        room = sync["rooms"]["join"][room_id]
        events = room["timeline"]["events"]
        assert [e["event_id"] for e in events] == [join.event_id, hello.event_id]
        assert events[1]["content"]["body"] == "hello from afar"
        assert events[1]["sender"] == BOB
        members = await hs.ok("GET", f"/rooms/{room_id}/joined_members", token=alice.token)
        assert set(members["joined"]) == {alice.user_id, BOB}


async def test_an_invite_from_another_server_shows_in_the_invited_users_sync(
    db_config: DatabaseConfig, tmp_path: Path, remote_key: SigningKey
) -> None:
    async with serve_homeserver(make_config(db_config, tmp_path)) as hs:
        alice = await hs.register("alice")
        await hs.engine.keys.add(REMOTE, key_id(remote_key), verify_key_base64(remote_key))
        first = await hs.ok("GET", "/sync", token=alice.token)
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
            state_key=alice.user_id,
        )
        name = {"type": "m.room.name", "state_key": "", "sender": BOB, "content": {"name": "Afar"}}
        body = {
            "event": dict(invite.data),
            "room_version": "11",
            "invite_room_state": [name, "junk"],
        }
        async with federation_client(FederationServer(hs.engine)) as fed:
            status, answer = await fed.call(
                "PUT",
                f"/_matrix/federation/v2/invite/{quote(room_id)}/{quote(invite.event_id)}",
                body,
            )
            assert status == 200, answer
        sync = await hs.ok("GET", f"/sync?since={first['next_batch']}&timeout=0", token=alice.token)
        invited = sync["rooms"]["invite"][room_id]["invite_state"]["events"]
        by_type = {e["type"]: e for e in invited}
        assert by_type["m.room.member"]["state_key"] == alice.user_id
        assert by_type["m.room.member"]["sender"] == BOB
        assert by_type["m.room.name"]["content"] == {"name": "Afar"}
        # An initial sync shows it too.
        initial = await hs.ok("GET", "/sync", token=alice.token)
        assert room_id in initial["rooms"]["invite"]
