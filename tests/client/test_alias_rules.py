"""Room alias rules over HTTP on both engines: what ``m.room.canonical_alias`` may name
(``400 M_BAD_ALIAS`` for aliases that do not exist or point elsewhere, ``400
M_INVALID_PARAM`` for malformed ones; through ``PUT /state`` and ``createRoom``'s
``initial_state``), and who may delete an alias (its creator, a server admin, a member
who may change the room's canonical alias)."""

from __future__ import annotations

import urllib.parse
from typing import Any

from tests.support.client import room_with
from tests.support.homeserver import Homeserver, User

CANONICAL = "m.room.canonical_alias"


def _dir(alias: str) -> str:
    return "/directory/room/" + urllib.parse.quote(alias, safe="")


async def _alias(hs: Homeserver, user: User, name: str, room_id: str) -> str:
    alias = f"#{name}:{hs.config.server_name}"
    await hs.ok("PUT", _dir(alias), {"room_id": room_id}, token=user.token)
    return alias


async def _put_canonical(hs: Homeserver, user: User, room_id: str, content: Any) -> Any:
    return await hs.call("PUT", f"/rooms/{room_id}/state/{CANONICAL}/", content, token=user.token)


async def _canonical(hs: Homeserver, user: User, room_id: str) -> Any:
    return await hs.call("GET", f"/rooms/{room_id}/state/{CANONICAL}/", token=user.token)


async def test_canonical_alias_must_name_aliases_of_the_room(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    room_id = await room_with(hs, alice)
    other_room = await room_with(hs, alice)
    mine = await _alias(hs, alice, "mine", room_id)
    elsewhere = await _alias(hs, alice, "elsewhere", other_room)
    server = hs.config.server_name

    bad_alias: list[dict[str, Any]] = [
        {"alias": f"#missing:{server}"},
        {"alias": elsewhere},
        {"alias": mine, "alt_aliases": [f"#missing:{server}"]},
        {"alt_aliases": [mine, elsewhere]},
        {"alias": "#remote:elsewhere.example"},  # cannot be checked: not taken
    ]
    for content in bad_alias:
        status, body = await _put_canonical(hs, alice, room_id, content)
        assert (status, body["errcode"]) == (400, "M_BAD_ALIAS"), content
    malformed: list[dict[str, Any]] = [
        {"alias": "mine"},
        {"alias": f"#:{server}"},
        {"alias": "#nocolon"},
        {"alias": 5},
        {"alias": mine, "alt_aliases": "not a list"},
        {"alias": mine, "alt_aliases": [mine, "!room:" + server]},
        {"alt_aliases": [None]},
    ]
    for content in malformed:
        status, body = await _put_canonical(hs, alice, room_id, content)
        assert (status, body["errcode"]) == (400, "M_INVALID_PARAM"), content
    # None of those was sent.
    status, _ = await _canonical(hs, alice, room_id)
    assert status == 404

    second = await _alias(hs, alice, "second", room_id)
    await hs.ok(
        "PUT", f"/rooms/{room_id}/state/{CANONICAL}/",
        {"alias": mine, "alt_aliases": [second]}, token=alice.token,
    )  # fmt: skip
    assert (await _canonical(hs, alice, room_id))[1] == {"alias": mine, "alt_aliases": [second]}
    # An alt alias the current event already lists is not checked again (it may have
    # been deleted since), only the ones added.
    await hs.ok("DELETE", _dir(second), token=alice.token)
    third = await _alias(hs, alice, "third", room_id)
    await hs.ok(
        "PUT", f"/rooms/{room_id}/state/{CANONICAL}/",
        {"alias": mine, "alt_aliases": [second, third]}, token=alice.token,
    )  # fmt: skip
    status, body = await _put_canonical(hs, alice, room_id, {"alias": second})
    assert (status, body["errcode"]) == (400, "M_BAD_ALIAS")
    # Removing the canonical alias needs no alias.
    await hs.ok("PUT", f"/rooms/{room_id}/state/{CANONICAL}/", {}, token=alice.token)
    await hs.ok("PUT", f"/rooms/{room_id}/state/{CANONICAL}/", {"alias": ""}, token=alice.token)


async def test_create_room_initial_state_canonical_alias(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    existing_room = await room_with(hs, alice)
    taken = await _alias(hs, alice, "taken", existing_room)
    server = hs.config.server_name
    before = (await hs.ok("GET", "/joined_rooms", token=alice.token))["joined_rooms"]

    def initial(content: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"type": CANONICAL, "state_key": "", "content": content}]

    for content, errcode in [
        ({"alias": f"#nowhere:{server}"}, "M_BAD_ALIAS"),
        ({"alias": taken}, "M_BAD_ALIAS"),
        ({"alt_aliases": [taken]}, "M_BAD_ALIAS"),
        ({"alias": "nowhere"}, "M_INVALID_PARAM"),
    ]:
        status, body = await hs.call(
            "POST", "/createRoom", {"initial_state": initial(content)}, token=alice.token
        )
        assert (status, body["errcode"]) == (400, errcode), content
    # No room was made on the way.
    after = (await hs.ok("GET", "/joined_rooms", token=alice.token))["joined_rooms"]
    assert sorted(after) == sorted(before)
    # The alias made with the room points to it.
    created = await hs.ok(
        "POST",
        "/createRoom",
        {"room_alias_name": "fresh", "initial_state": initial({"alias": f"#fresh:{server}"})},
        token=alice.token,
    )
    status, content = await _canonical(hs, alice, created["room_id"])
    assert (status, content) == (200, {"alias": f"#fresh:{server}"})


async def test_who_may_delete_an_alias(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")  # room creator: power 100
    bob = await hs.register("bob")
    carol = await hs.register("carol")
    dave = await hs.register("dave")  # not in the room
    room_id = await room_with(hs, alice, bob, carol)

    # Carol (power 0) made aliases; she may delete her own.
    own = await _alias(hs, carol, "own", room_id)
    await hs.ok("DELETE", _dir(own), token=carol.token)
    assert (await hs.call("GET", _dir(own)))[0] == 404

    # Bob (power 0, canonical alias needs 50) may not delete Carol's; nor may Dave.
    by_carol = await _alias(hs, carol, "by-carol", room_id)
    for user in (bob, dave):
        status, body = await hs.call("DELETE", _dir(by_carol), token=user.token)
        assert (status, body["errcode"]) == (403, "M_FORBIDDEN"), user.user_id
    # Alice may: she may change the room's canonical alias.
    await hs.ok("DELETE", _dir(by_carol), token=alice.token)

    # Bob gets exactly the canonical alias's power level, then may.
    levels = await hs.ok("GET", f"/rooms/{room_id}/state/m.room.power_levels/", token=alice.token)
    levels["events"] = {**levels.get("events", {}), CANONICAL: 40}
    levels["users"] = {**levels["users"], bob.user_id: 40}
    await hs.ok("PUT", f"/rooms/{room_id}/state/m.room.power_levels/", levels, token=alice.token)
    again = await _alias(hs, carol, "again", room_id)
    await hs.ok("DELETE", _dir(again), token=bob.token)
    # ... unless he left the room.
    more = await _alias(hs, carol, "more", room_id)
    await hs.ok("POST", f"/rooms/{room_id}/leave", {}, token=bob.token)
    status, _ = await hs.call("DELETE", _dir(more), token=bob.token)
    assert status == 403

    # A server admin may, in any room.
    await hs.process.accounts.create_account("admin", "admin-password", admin=True)
    login = await hs.ok(
        "POST",
        "/login",
        {
            "type": "m.login.password",
            "identifier": {"type": "m.id.user", "user": "admin"},
            "password": "admin-password",
        },
    )
    await hs.ok("DELETE", _dir(more), token=login["access_token"])
    assert (await hs.call("GET", _dir(more)))[0] == 404
