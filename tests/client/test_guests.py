"""Guest access through the API, on both engines: registration behind
``allow_guest_access``, what a guest's token may call (Synapse's list,
``roomstream.client.guests``), ``m.room.guest_access`` on join, reading, and upgrading
a guest to a full account."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from roomstream.accounts import Accounts, AccountStore
from roomstream.client.guests import GUEST_ROUTES
from roomstream.errors import ForbiddenError, GuestAccessForbiddenError
from roomstream.storage import Database, DatabaseConfig
from tests.support.homeserver import SERVER_NAME, Homeserver, User, make_config, serve_homeserver


@pytest.fixture
async def hs(db_config: DatabaseConfig, tmp_path: Path) -> AsyncIterator[Homeserver]:
    """The ``homeserver`` fixture with guest access on."""
    config = make_config(db_config, tmp_path, allow_guest_access=True)
    async with serve_homeserver(config) as server:
        yield server


async def register_guest(hs: Homeserver, body: Any = None) -> User:
    result = await hs.ok("POST", "/register?kind=guest", {} if body is None else body)
    return User(result["user_id"], result["access_token"], result["device_id"])


async def errcode(hs: Homeserver, method: str, path: str, body: Any, token: str) -> tuple[int, str]:
    status, answer = await hs.call(method, path, body, token=token)
    return status, answer.get("errcode", "")


async def room_for_guests(hs: Homeserver, owner: User, *state: tuple[str, dict[str, Any]]) -> str:
    """A public room with ``state`` events (type, content) sent by ``owner``."""
    room_id = str(
        (await hs.ok("POST", "/createRoom", {"preset": "public_chat"}, token=owner.token))[
            "room_id"
        ]
    )
    for event_type, content in state:
        await hs.ok("PUT", f"/rooms/{room_id}/state/{event_type}/", content, token=owner.token)
    return room_id


CAN_JOIN = ("m.room.guest_access", {"guest_access": "can_join"})
WORLD_READABLE = ("m.room.history_visibility", {"history_visibility": "world_readable"})


async def test_guest_registration_is_off_by_default(homeserver: Homeserver) -> None:
    status, body = await homeserver.call("POST", "/register?kind=guest", {})
    assert (status, body["errcode"]) == (403, "M_GUEST_ACCESS_FORBIDDEN")
    status, body = await homeserver.call("POST", "/register?kind=robot", {})
    assert (status, body["errcode"]) == (400, "M_INVALID_PARAM")


async def test_guest_registration_and_whoami(hs: Homeserver) -> None:
    guest = await register_guest(hs, {"initial_device_display_name": "kiosk", "device_id": "MINE"})
    localpart, _, server = guest.user_id[1:].partition(":")
    assert localpart.isdigit() and server == SERVER_NAME
    assert guest.device_id != "MINE"  # guests do not choose their device (Synapse)
    whoami = await hs.ok("GET", "/account/whoami", token=guest.token)
    assert whoami == {"user_id": guest.user_id, "device_id": guest.device_id, "is_guest": True}
    devices = (await hs.ok("GET", "/devices", token=guest.token))["devices"]
    assert [(d["device_id"], d["display_name"]) for d in devices] == [(guest.device_id, "kiosk")]
    other = await register_guest(hs)
    assert other.user_id != guest.user_id
    # Guests have no password: no login.
    status, body = await hs.call(
        "POST", "/login", {"type": "m.login.password", "user": localpart, "password": "x"}
    )
    assert (status, body["errcode"]) == (403, "M_FORBIDDEN")
    record = await hs.process.accounts.store.get_user(guest.user_id)
    assert record is not None and record.is_guest and record.password_hash is None


async def test_guest_registration_ignores_closed_registration(database: Database) -> None:
    """As Synapse: ``enable_registration: false`` closes user registration, not guests'."""
    accounts = Accounts(
        AccountStore(database), "test.local", registration_enabled=False, guest_access_enabled=True
    )
    guest = await accounts.register_guest()
    assert guest.access_token is not None
    with pytest.raises(ForbiddenError):
        await accounts.register("x", "pw", auth={"type": "m.login.dummy"})
    closed = Accounts(AccountStore(database), "test.local")
    with pytest.raises(GuestAccessForbiddenError):
        await closed.register(None, None, auth=None, guest=True)


async def test_what_a_guest_may_not_call(hs: Homeserver) -> None:
    guest = await register_guest(hs)
    alice = await hs.register("alice")
    room_id = await room_for_guests(hs, alice, CAN_JOIN)
    forbidden = (403, "M_GUEST_ACCESS_FORBIDDEN")
    for method, path, body in [
        ("POST", "/createRoom", {}),
        ("POST", f"/user/{guest.user_id}/filter", {}),
        ("PUT", f"/user/{guest.user_id}/account_data/m.x", {}),
        ("PUT", f"/rooms/{room_id}/typing/{guest.user_id}", {"typing": True}),
        ("POST", f"/rooms/{room_id}/invite", {"user_id": alice.user_id}),
        ("POST", f"/rooms/{room_id}/read_markers", {}),
        ("GET", "/pushrules/", None),
        ("POST", "/logout", {}),
        ("POST", "/account/password", {"new_password": "x"}),
        ("POST", "/account/deactivate", {}),
        ("GET", "/account/3pid", None),
        ("POST", "/user_directory/search", {"search_term": "a"}),
        ("DELETE", f"/devices/{guest.device_id}", {}),
        ("POST", "/keys/device_signing/upload", {}),
    ]:
        assert await errcode(hs, method, path, body, guest.token) == forbidden, path
    # Refused before anything happened: the guest is still logged in, in no room.
    await hs.ok("GET", "/account/whoami", token=guest.token)
    assert await hs.engine.store.get_rooms_for_user(guest.user_id) == []
    # The same calls with a full account's token are not refused as a guest's.
    assert (await errcode(hs, "GET", "/pushrules/", None, alice.token))[0] == 200


async def test_guest_joins_only_where_guest_access_is_can_join(hs: Homeserver) -> None:
    guest = await register_guest(hs)
    alice = await hs.register("alice")
    closed = await room_for_guests(hs, alice)  # public, no m.room.guest_access
    forbidden = await room_for_guests(hs, alice, ("m.room.guest_access", {"guest_access": "no"}))
    for room_id in (closed, forbidden):
        for path in (f"/rooms/{room_id}/join", f"/join/{room_id}"):
            assert await errcode(hs, "POST", path, {}, guest.token) == (403, "M_FORBIDDEN")
        assert await hs.engine.store.get_membership(room_id, guest.user_id) is None
    # A private room's preset says can_join, but its join rule still asks for an invite.
    private = (await hs.ok("POST", "/createRoom", {}, token=alice.token))["room_id"]
    assert await errcode(hs, "POST", f"/rooms/{private}/join", {}, guest.token) == (
        403,
        "M_FORBIDDEN",
    )
    room_id = await room_for_guests(hs, alice, CAN_JOIN)
    await hs.ok("POST", f"/join/{room_id}", {}, token=guest.token)
    member = await hs.ok(
        "GET", f"/rooms/{room_id}/state/m.room.member/{guest.user_id}", token=alice.token
    )
    # A guest's profile is its generated localpart, as Synapse makes it.
    localpart = guest.user_id[1:].partition(":")[0]
    assert member == {"membership": "join", "kind": "guest", "displayname": localpart}
    assert await hs.ok("GET", "/joined_rooms", token=guest.token) == {"joined_rooms": [room_id]}
    # A joined guest sends, reads and syncs, and may leave.
    sent = await hs.ok(
        "PUT",
        f"/rooms/{room_id}/send/m.room.message/{hs.txn()}",
        {"msgtype": "m.text", "body": "hello from a guest"},
        token=guest.token,
    )
    await hs.ok(
        "PUT",
        f"/rooms/{room_id}/send/m.room.message/{hs.txn()}",
        {"msgtype": "m.text", "body": "hello guest"},
        token=alice.token,
    )
    sync = await hs.ok("GET", "/sync", token=guest.token)
    timeline = sync["rooms"]["join"][room_id]["timeline"]["events"]
    assert [e["content"].get("body") for e in timeline][-2:] == [
        "hello from a guest",
        "hello guest",
    ]
    messages = await hs.ok("GET", f"/rooms/{room_id}/messages?dir=b&limit=5", token=guest.token)
    assert messages["chunk"][1]["event_id"] == sent["event_id"]
    await hs.ok("GET", f"/rooms/{room_id}/event/{sent['event_id']}", token=guest.token)
    await hs.ok("GET", f"/rooms/{room_id}/members", token=guest.token)
    await hs.ok("GET", f"/rooms/{room_id}/state", token=guest.token)
    await hs.ok("POST", f"/rooms/{room_id}/leave", {}, token=guest.token)
    assert await hs.engine.store.get_membership(room_id, guest.user_id) == "leave"


async def test_guest_reads_world_readable_rooms_without_joining(hs: Homeserver) -> None:
    guest = await register_guest(hs)
    alice = await hs.register("alice")
    room_id = await room_for_guests(hs, alice, WORLD_READABLE)
    sent = await hs.ok(
        "PUT",
        f"/rooms/{room_id}/send/m.room.message/{hs.txn()}",
        {"msgtype": "m.text", "body": "for everyone"},
        token=alice.token,
    )
    # Not can_join: reading only.
    assert await errcode(hs, "POST", f"/rooms/{room_id}/join", {}, guest.token) == (
        403,
        "M_FORBIDDEN",
    )
    messages = await hs.ok("GET", f"/rooms/{room_id}/messages?dir=b", token=guest.token)
    assert sent["event_id"] in [e["event_id"] for e in messages["chunk"]]
    event = await hs.ok("GET", f"/rooms/{room_id}/event/{sent['event_id']}", token=guest.token)
    assert event["content"]["body"] == "for everyone"
    state = await hs.ok("GET", f"/rooms/{room_id}/state", token=guest.token)
    assert {e["type"] for e in state} >= {"m.room.create", "m.room.history_visibility"}
    peek = await hs.ok("GET", f"/rooms/{room_id}/initialSync", token=guest.token)
    assert sent["event_id"] in [e["event_id"] for e in peek["messages"]["chunk"]]
    # A room that is neither: nothing of its history reaches the guest.
    private = await room_for_guests(hs, alice)
    secret = await hs.ok(
        "PUT",
        f"/rooms/{private}/send/m.room.message/{hs.txn()}",
        {"msgtype": "m.text", "body": "members only"},
        token=alice.token,
    )
    status, answer = await hs.call("GET", f"/rooms/{private}/messages?dir=b", token=guest.token)
    assert status == 403 or secret["event_id"] not in [e["event_id"] for e in answer["chunk"]]
    status, answer = await hs.call(
        "GET", f"/rooms/{private}/event/{secret['event_id']}", token=guest.token
    )
    assert status in (403, 404)


async def test_upgrading_a_guest_to_a_full_account(hs: Homeserver) -> None:
    guest = await register_guest(hs)
    alice = await hs.register("alice")
    room_id = await room_for_guests(hs, alice, CAN_JOIN)
    await hs.ok("POST", f"/rooms/{room_id}/join", {}, token=guest.token)
    localpart = guest.user_id[1:].partition(":")[0]
    body: dict[str, Any] = {
        "username": localpart,
        "password": "now a member",
        "guest_access_token": guest.token,
    }
    # The usual user-interactive auth (one dummy stage) first; nothing changed yet.
    status, answer = await hs.call("POST", "/register", body)
    assert status == 401 and answer["flows"] == [{"stages": ["m.login.dummy"]}]
    await hs.ok("GET", "/account/whoami", token=guest.token)
    body["auth"] = {"type": "m.login.dummy", "session": answer["session"]}
    upgraded = await hs.ok("POST", "/register", body)
    assert upgraded["user_id"] == guest.user_id
    token = upgraded["access_token"]
    whoami = await hs.ok("GET", "/account/whoami", token=token)
    assert whoami == {
        "user_id": guest.user_id,
        "device_id": upgraded["device_id"],
        "is_guest": False,
    }
    # The guest's token ended with the upgrade; the account keeps its rooms.
    status, answer = await hs.call("GET", "/account/whoami", token=guest.token)
    assert (status, answer["errcode"]) == (401, "M_UNKNOWN_TOKEN")
    assert await hs.ok("GET", "/joined_rooms", token=token) == {"joined_rooms": [room_id]}
    await hs.ok("POST", "/createRoom", {}, token=token)  # no longer a guest's call
    login = {"type": "m.login.password", "user": localpart, "password": "now a member"}
    assert (await hs.ok("POST", "/login", login))["user_id"] == guest.user_id
    # Retried through the same session (the answer was lost): the same account again.
    again = await hs.ok("POST", "/register", body)
    assert again["user_id"] == guest.user_id and again["access_token"] != token
    # Its old token cannot upgrade anything any more.
    status, answer = await hs.call("POST", "/register", {**body, "auth": None})
    assert (status, answer["errcode"]) == (403, "M_FORBIDDEN")


async def test_upgrade_refusals(hs: Homeserver) -> None:
    guest = await register_guest(hs)
    other = await register_guest(hs)
    alice = await hs.register("alice")
    dummy = {"type": "m.login.dummy"}

    async def refused(body: dict[str, Any]) -> tuple[int, str]:
        status, answer = await hs.call(
            "POST", "/register", {"password": "pw", "auth": dummy, **body}
        )
        return status, answer.get("errcode", "")

    forbidden = (403, "M_FORBIDDEN")
    # Another guest's name, a full account's token, a token that is no one's.
    other_name = other.user_id[1:].partition(":")[0]
    assert await refused({"username": other_name, "guest_access_token": guest.token}) == forbidden
    assert await refused({"username": "alice", "guest_access_token": alice.token}) == forbidden
    assert await refused({"guest_access_token": "rsg_nobody"}) == forbidden
    assert await refused({"guest_access_token": 5}) == (400, "M_BAD_JSON")
    # Numeric names are the guests': a full account cannot take one.
    assert await refused({"username": "1234"}) == (400, "M_INVALID_USERNAME")
    status, answer = await hs.call("GET", "/register/available?username=1234")
    assert (status, answer["errcode"]) == (400, "M_INVALID_USERNAME")
    # Nothing changed for either guest.
    for user in (guest, other):
        whoami = await hs.ok("GET", "/account/whoami", token=user.token)
        assert whoami["is_guest"] is True


async def test_every_guest_route_exists(hs: Homeserver) -> None:
    served = {(r.method, r.path) for r in hs.process.api.routes}
    assert served >= GUEST_ROUTES, sorted(GUEST_ROUTES - served)


async def test_withdrawing_guest_access_makes_guests_leave(hs: Homeserver) -> None:
    """As Synapse's kick_guest_users: once ``m.room.guest_access`` is no longer
    ``can_join``, every guest joined to the room leaves it by their own leave event; full
    members stay."""
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    guest = await register_guest(hs, {})
    room_id = await room_for_guests(hs, alice, CAN_JOIN)
    for user in (bob, guest):
        await hs.ok("POST", f"/join/{room_id}", {}, token=user.token)
    await hs.ok(
        "PUT",
        f"/rooms/{room_id}/state/m.room.guest_access/",
        {"guest_access": "forbidden"},
        token=alice.token,
    )
    members = await hs.ok("GET", f"/rooms/{room_id}/members", token=alice.token)
    by_user = {e["state_key"]: e for e in members["chunk"]}
    assert by_user[guest.user_id]["content"]["membership"] == "leave"
    assert by_user[guest.user_id]["sender"] == guest.user_id
    assert by_user[bob.user_id]["content"]["membership"] == "join"
    status, body = await hs.call("POST", f"/join/{room_id}", {}, token=guest.token)
    assert (status, body["errcode"]) == (403, "M_FORBIDDEN")
