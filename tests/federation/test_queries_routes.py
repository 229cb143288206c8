"""The federation queries over HTTP (authenticated by a stub that reads the origin from a
test header): each answer's shape as the spec and Synapse's handlers give it, the
refusals (unknown: 404 ``M_NOT_FOUND``; another server's user or alias: 400; no
authentication: 401), on both engines."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from email.parser import BytesParser
from email.policy import HTTP
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson
import pytest
from PIL import Image

from roomstream.storage import DatabaseConfig
from tests.federation.edus_support import BOB, REMOTE, STRANGER, join_remote
from tests.federation.queries_support import Fed, errcode, fed_server
from tests.support.e2e_keys import CrossSigning, Device, password_auth
from tests.support.homeserver import SERVER_NAME


@pytest.fixture
async def fed(db_config: DatabaseConfig, tmp_path: Path) -> AsyncIterator[Fed]:
    async for one in fed_server(db_config, tmp_path):
        yield one


# -- authentication ------------------------------------------------------------------------


async def test_every_query_refuses_an_unauthenticated_request(fed: Fed) -> None:
    alice = fed.scene.alice.user_id
    for method, path in [
        ("GET", f"/query/profile?user_id={quote(alice)}"),
        ("GET", f"/query/directory?room_alias={quote('#a:' + SERVER_NAME)}"),
        ("GET", "/publicRooms"),
        ("POST", "/publicRooms"),
        ("GET", f"/user/devices/{quote(alice)}"),
        ("POST", "/user/keys/query"),
        ("POST", "/user/keys/claim"),
        ("GET", f"/hierarchy/{quote(fed.scene.room_id)}"),
        ("GET", "/media/download/abc"),
        ("GET", "/media/thumbnail/abc?width=1&height=1"),
    ]:
        status, answer = await fed.call(method, path, {} if method == "POST" else None, origin=None)
        assert (status, errcode(answer)) == (401, "M_MISSING_TOKEN"), path


# -- profile and directory -------------------------------------------------------------------


async def test_profile_query(fed: Fed) -> None:
    hs, alice = fed.scene.hs, fed.scene.alice
    path = f"/profile/{quote(alice.user_id)}/displayname"
    await hs.ok("PUT", path, {"displayname": "Alice A."}, token=alice.token)
    who = quote(alice.user_id)
    # Synapse: the fields set (avatar_url unset: absent, not null).
    assert await fed.ok("GET", f"/query/profile?user_id={who}") == {"displayname": "Alice A."}
    assert await fed.ok("GET", f"/query/profile?user_id={who}&field=displayname") == {
        "displayname": "Alice A."
    }
    assert await fed.ok("GET", f"/query/profile?user_id={who}&field=avatar_url") == {}
    status, answer = await fed.call(
        "GET", f"/query/profile?user_id={quote('@nobody:' + SERVER_NAME)}"
    )
    assert (status, errcode(answer)) == (404, "M_NOT_FOUND")
    status, answer = await fed.call("GET", f"/query/profile?user_id={quote(BOB)}")
    assert (status, errcode(answer)) == (400, "M_UNKNOWN")
    status, answer = await fed.call("GET", "/query/profile")
    assert (status, errcode(answer)) == (400, "M_MISSING_PARAM")


async def test_directory_query(fed: Fed) -> None:
    hs, alice, room_id = fed.scene.hs, fed.scene.alice, fed.scene.room_id
    alias = f"#lobby:{SERVER_NAME}"
    await hs.ok("PUT", f"/directory/room/{quote(alias)}", {"room_id": room_id}, token=alice.token)
    answer = await fed.ok("GET", f"/query/directory?room_alias={quote(alias)}")
    # This server first, then the others in the room (Bob's).
    assert answer == {"room_id": room_id, "servers": [SERVER_NAME, REMOTE]}
    missing = quote(f"#nothing:{SERVER_NAME}")
    status, body = await fed.call("GET", f"/query/directory?room_alias={missing}")
    assert (status, errcode(body)) == (404, "M_NOT_FOUND")
    status, body = await fed.call("GET", f"/query/directory?room_alias={quote('#x:' + REMOTE)}")
    assert (status, errcode(body)) == (400, "M_UNKNOWN")
    status, body = await fed.call("GET", "/query/directory?room_alias=notanalias")
    assert (status, errcode(body)) == (400, "M_INVALID_PARAM")


async def test_public_rooms_is_the_client_apis_list(fed: Fed) -> None:
    hs = fed.scene.hs
    client = await hs.ok("GET", "/publicRooms")
    assert await fed.ok("GET", "/publicRooms") == client
    assert await fed.ok("POST", "/publicRooms", {"limit": 5, "filter": {}}) == client
    assert set(client) >= {"chunk", "total_room_count_estimate"}
    status, answer = await fed.call("POST", "/publicRooms", {"limit": -1})
    assert (status, errcode(answer)) == (400, "M_INVALID_PARAM")
    status, answer = await fed.call("GET", "/publicRooms?since=nonsense")
    assert (status, errcode(answer)) == (400, "M_INVALID_PARAM")


# -- devices and keys --------------------------------------------------------------------------


async def upload_keys(fed: Fed) -> tuple[Device, CrossSigning]:
    hs, alice = fed.scene.hs, fed.scene.alice
    device = Device(alice.user_id, alice.device_id)
    body = {"device_keys": device.device_keys(), "one_time_keys": device.one_time_keys(["1"])}
    await hs.ok("POST", "/keys/upload", body, token=alice.token)
    cross = CrossSigning(alice.user_id)
    upload = {**cross.upload_body(), "auth": password_auth(alice.user_id)}
    await hs.ok("POST", "/keys/device_signing/upload", upload, token=alice.token)
    return device, cross


async def test_user_devices(fed: Fed) -> None:
    hs, alice = fed.scene.hs, fed.scene.alice
    device, cross = await upload_keys(fed)
    # A second device without keys is not listed (Synapse lists devices with keys).
    await hs.ok("POST", "/login", {"type": "m.login.password", **password_auth(alice.user_id)})
    answer = await fed.ok("GET", f"/user/devices/{quote(alice.user_id)}")
    assert set(answer) == {"user_id", "stream_id", "devices", "master_key", "self_signing_key"}
    assert answer["user_id"] == alice.user_id
    assert isinstance(answer["stream_id"], int) and answer["stream_id"] > 0
    (entry,) = answer["devices"]
    assert entry["device_id"] == alice.device_id
    assert entry["keys"]["keys"] == device.device_keys()["keys"]
    assert set(entry) == {"device_id", "keys"}  # no display name over federation
    assert answer["master_key"]["keys"] == cross.master_key()["keys"]
    assert answer["self_signing_key"]["usage"] == ["self_signing"]
    # The user-signing key never leaves.
    assert "user_signing_key" not in answer
    status, body = await fed.call("GET", f"/user/devices/{quote(BOB)}")
    assert (status, errcode(body)) == (400, "M_UNKNOWN")


async def test_user_devices_of_a_user_without_keys(fed: Fed) -> None:
    alice = fed.scene.alice
    answer = await fed.ok("GET", f"/user/devices/{quote(alice.user_id)}")
    assert answer["devices"] == [] and answer["user_id"] == alice.user_id
    assert "master_key" not in answer


async def test_keys_query_and_claim(fed: Fed) -> None:
    alice = fed.scene.alice
    device, _ = await upload_keys(fed)
    answer = await fed.ok("POST", "/user/keys/query", {"device_keys": {alice.user_id: []}})
    assert set(answer) == {"device_keys", "master_keys", "self_signing_keys", "user_signing_keys"}
    assert list(answer["device_keys"][alice.user_id]) == [alice.device_id]
    assert alice.user_id in answer["master_keys"]
    assert answer["user_signing_keys"] == {}
    named = await fed.ok("POST", "/user/keys/query", {"device_keys": {alice.user_id: ["NONE"]}})
    assert named["device_keys"][alice.user_id] == {}
    status, body = await fed.call("POST", "/user/keys/query", {"device_keys": {BOB: []}})
    assert (status, errcode(body)) == (400, "M_UNKNOWN")
    status, body = await fed.call("POST", "/user/keys/query", {"device_keys": []})
    assert (status, errcode(body)) == (400, "M_BAD_JSON")

    wanted = {"one_time_keys": {alice.user_id: {alice.device_id: "signed_curve25519"}}}
    claimed = await fed.ok("POST", "/user/keys/claim", wanted)
    assert set(claimed) == {"one_time_keys"}
    key = claimed["one_time_keys"][alice.user_id][alice.device_id]
    assert key == device.one_time_keys(["1"])
    # One-time: none left the second time.
    again = await fed.ok("POST", "/user/keys/claim", wanted)
    assert again == {"one_time_keys": {}}
    status, body = await fed.call(
        "POST", "/user/keys/claim", {"one_time_keys": {BOB: {"D": "signed_curve25519"}}}
    )
    assert (status, errcode(body)) == (400, "M_UNKNOWN")


# -- hierarchy ---------------------------------------------------------------------------------


async def make_space(fed: Fed) -> tuple[str, str, str]:
    """A public space with a public child and a child restricted to the space's members."""
    hs, alice = fed.scene.hs, fed.scene.alice
    space = (
        await hs.ok(
            "POST",
            "/createRoom",
            {"preset": "public_chat", "name": "Space", "creation_content": {"type": "m.space"}},
            token=alice.token,
        )
    )["room_id"]
    public = (
        await hs.ok(
            "POST", "/createRoom", {"preset": "public_chat", "name": "Pub"}, token=alice.token
        )
    )["room_id"]
    restricted_rule = {
        "type": "m.room.join_rules",
        "state_key": "",
        "content": {
            "join_rule": "restricted",
            "allow": [{"type": "m.room_membership", "room_id": space}],
        },
    }
    restricted = (
        await hs.ok(
            "POST",
            "/createRoom",
            {"preset": "private_chat", "name": "Members", "initial_state": [restricted_rule]},
            token=alice.token,
        )
    )["room_id"]
    for order, child in (("a", public), ("b", restricted)):
        path = f"/rooms/{space}/state/m.space.child/{quote(child)}"
        await hs.ok("PUT", path, {"via": [SERVER_NAME], "order": order}, token=alice.token)
    return space, public, restricted


async def test_hierarchy_for_a_server_in_the_space_and_for_a_stranger(fed: Fed) -> None:
    space, public, restricted = await make_space(fed)
    # Bob's server is in the space: the restricted child's allow list lets it see that.
    await join_remote(fed.scene.hs, space, BOB)
    answer = await fed.ok("GET", f"/hierarchy/{quote(space)}")
    assert set(answer) == {"room", "children", "inaccessible_children"}
    root = answer["room"]
    assert root["room_id"] == space and root["room_type"] == "m.space"
    assert root["num_joined_members"] == 2 and root["join_rule"] == "public"
    assert [c["state_key"] for c in root["children_state"]] == [public, restricted]
    assert all(
        set(c) == {"type", "state_key", "content", "sender", "origin_server_ts"}
        for c in root["children_state"]
    )
    assert [c["room_id"] for c in answer["children"]] == [public, restricted]
    assert all("children_state" not in c for c in answer["children"])
    (members,) = [c for c in answer["children"] if c["room_id"] == restricted]
    assert members["allowed_room_ids"] == [space] and members["join_rule"] == "restricted"
    assert answer["inaccessible_children"] == []

    stranger = await fed.ok("GET", f"/hierarchy/{quote(space)}", origin=STRANGER)
    assert [c["room_id"] for c in stranger["children"]] == [public]
    assert stranger["inaccessible_children"] == [restricted]
    status, body = await fed.call("GET", f"/hierarchy/{quote(restricted)}", origin=STRANGER)
    assert (status, errcode(body)) == (404, "M_NOT_FOUND")
    status, body = await fed.call("GET", f"/hierarchy/{quote('!unknown:' + SERVER_NAME)}")
    assert (status, errcode(body)) == (404, "M_NOT_FOUND")
    suggested = await fed.ok("GET", f"/hierarchy/{quote(space)}?suggested_only=true")
    assert suggested["room"]["children_state"] == [] and suggested["children"] == []


# -- media -------------------------------------------------------------------------------------


def parts(content_type: str, body: bytes) -> list[tuple[str, Any, Any]]:
    """(Content-Type, Content-Disposition, payload) of each part of a multipart answer."""
    message = BytesParser(policy=HTTP).parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + body
    )
    assert message.is_multipart()
    return [
        (p.get_content_type(), p.get("Content-Disposition"), p.get_payload(decode=True))
        for p in message.iter_parts()
    ]


async def upload(fed: Fed, data: bytes, content_type: str, name: str) -> str:
    hs, alice = fed.scene.hs, fed.scene.alice
    status, body = await hs.call(
        "POST",
        f"/_matrix/media/v3/upload?filename={name}",
        raw=data,
        token=alice.token,
        headers={"Content-Type": content_type},
    )
    assert status == 200, body
    return str(body["content_uri"]).rpartition("/")[2]


async def test_media_download_is_multipart_json_then_content(fed: Fed) -> None:
    data = b"hello federation\r\n--not-a-boundary\r\n" * 100
    media_id = await upload(fed, data, "application/octet-stream", "notes.bin")
    status, content_type, body = await fed.raw("GET", f"/media/download/{media_id}")
    assert status == 200 and content_type.startswith("multipart/mixed; boundary=")
    (json_type, _, json_part), (file_type, disposition, file_part) = parts(content_type, body)
    assert json_type == "application/json" and orjson.loads(json_part) == {}
    assert file_type == "application/octet-stream" and file_part == data
    assert disposition is not None and "attachment" in disposition and "notes.bin" in disposition
    status, _, body = await fed.raw("GET", "/media/download/doesnotexist")
    assert status == 404 and orjson.loads(body)["errcode"] == "M_NOT_FOUND"


async def test_media_thumbnail_is_multipart(fed: Fed) -> None:
    out = io.BytesIO()
    Image.new("RGB", (640, 480), "red").save(out, "PNG")
    media_id = await upload(fed, out.getvalue(), "image/png", "red.png")
    path = f"/media/thumbnail/{media_id}?width=32&height=32&method=scale"
    status, content_type, body = await fed.raw("GET", path)
    assert status == 200, body[:200]
    (json_type, _, json_part), (file_type, _, file_part) = parts(content_type, body)
    assert json_type == "application/json" and orjson.loads(json_part) == {}
    assert file_type.startswith("image/")
    image = Image.open(io.BytesIO(file_part))
    assert max(image.size) < 640
    status, _, body = await fed.raw("GET", f"/media/thumbnail/{media_id}?width=32")
    assert status == 400 and orjson.loads(body)["errcode"] == "M_MISSING_PARAM"
