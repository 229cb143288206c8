"""``POST /rooms/{id}/send/{type}``: the deprecated send without a transaction ID."""

from __future__ import annotations

from tests.support.homeserver import Homeserver


async def test_each_post_sends_a_new_event_on_r0_and_v3(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    room_id = (await homeserver.ok("POST", "/createRoom", {}, token=alice.token))["room_id"]
    body = {"msgtype": "m.text", "body": "hello"}
    sent = []
    for version in ("r0", "v3", "r0"):
        path = f"/_matrix/client/{version}/rooms/{room_id}/send/m.room.message"
        sent.append((await homeserver.ok("POST", path, body, token=alice.token))["event_id"])
    # Not idempotent (no transaction ID): three POSTs, three events (as Synapse).
    assert len(set(sent)) == 3
    page = await homeserver.ok("GET", f"/rooms/{room_id}/messages?dir=b&limit=3", token=alice.token)
    assert [e["event_id"] for e in page["chunk"]] == list(reversed(sent))
    assert all(e["content"] == body and e["sender"] == alice.user_id for e in page["chunk"])
    # The sending device is not told of a transaction ID it never chose.
    assert all("transaction_id" not in e.get("unsigned", {}) for e in page["chunk"])


async def test_refusals_and_bad_input(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    room_id = (await homeserver.ok("POST", "/createRoom", {}, token=alice.token))["room_id"]
    path = f"/rooms/{room_id}/send/m.room.message"
    status, body = await homeserver.call("POST", path, {"body": "x"}, token=bob.token)
    assert (status, body["errcode"]) == (403, "M_FORBIDDEN")
    status, body = await homeserver.call("POST", path, {"body": "x"})
    assert (status, body["errcode"]) == (401, "M_MISSING_TOKEN")
    status, body = await homeserver.call("POST", path, raw=b"{nope", token=alice.token)
    assert (status, body["errcode"]) == (400, "M_NOT_JSON")
    status, body = await homeserver.call("POST", path, raw=b"[1]", token=alice.token)
    assert (status, body["errcode"]) == (400, "M_BAD_JSON")
    status, body = await homeserver.call(
        "POST", "/rooms/nope/send/m.room.message", {}, token=alice.token
    )
    assert (status, body["errcode"]) == (400, "M_INVALID_PARAM")
    status, body = await homeserver.call(
        "POST", f"/rooms/{room_id}/send/{'x' * 300}", {}, token=alice.token
    )
    assert (status, body["errcode"]) == (400, "M_INVALID_PARAM")
