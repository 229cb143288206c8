"""Rooms of every version 1 to 12 through the Client-Server API: ``/capabilities``
lists them (the default unchanged), ``createRoom`` makes each, members join, talk and
redact, and clients see each version's event IDs (``$opaque:server`` in 1 and 2)."""

from __future__ import annotations

import re
from urllib.parse import quote

import pytest

from tests.support.homeserver import Homeserver

VERSIONS = [str(n) for n in range(1, 13)]
HASH_ID = re.compile(r"\$[A-Za-z0-9+/_-]{43}")


async def test_capabilities_list_versions_1_to_12(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    capabilities = (await homeserver.ok("GET", "/capabilities", token=alice.token))["capabilities"]
    versions = capabilities["m.room_versions"]
    assert versions["available"] == {v: "stable" for v in VERSIONS}
    assert versions["default"] == "12"
    status, body = await homeserver.call(
        "POST", "/createRoom", {"room_version": "13"}, token=alice.token
    )
    assert (status, body["errcode"]) == (400, "M_UNSUPPORTED_ROOM_VERSION")


@pytest.mark.parametrize("version", VERSIONS)
async def test_create_join_talk_and_redact(homeserver: Homeserver, version: str) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    room_id = (
        await hs.ok(
            "POST",
            "/createRoom",
            {"room_version": version, "preset": "public_chat", "name": f"v{version}"},
            token=alice.token,
        )
    )["room_id"]
    create = await hs.ok("GET", f"/rooms/{room_id}/state/m.room.create/", token=alice.token)
    assert create["room_version"] == version
    await hs.ok("POST", f"/rooms/{room_id}/join", {}, token=bob.token)
    sent = await hs.ok(
        "PUT",
        f"/rooms/{room_id}/send/m.room.message/t1",
        {"msgtype": "m.text", "body": "hi"},
        token=bob.token,
    )
    event_id = sent["event_id"]
    if version in ("1", "2"):
        assert event_id.startswith("$") and event_id.endswith(":" + hs.config.server_name)
    else:
        assert HASH_ID.fullmatch(event_id)
        if version != "3":
            assert "+" not in event_id and "/" not in event_id
    fetched = await hs.ok(
        "GET", f"/rooms/{room_id}/event/{quote(event_id, safe='')}", token=alice.token
    )
    assert fetched["event_id"] == event_id and fetched["content"]["body"] == "hi"
    # Bob redacts his own message (v1/v2: allowed as the two IDs share a server).
    redaction = await hs.ok(
        "PUT",
        f"/rooms/{room_id}/redact/{quote(event_id, safe='')}/r1",
        {"reason": "oops"},
        token=bob.token,
    )
    assert redaction["event_id"] != event_id
    redacted = await hs.ok(
        "GET", f"/rooms/{room_id}/event/{quote(event_id, safe='')}", token=alice.token
    )
    assert redacted["content"] == {}
    sync = await hs.ok("GET", "/sync", token=alice.token)
    timeline = sync["rooms"]["join"][room_id]["timeline"]["events"]
    assert any(e["event_id"] == redaction["event_id"] for e in timeline)
