"""User-defined push rules (``PUT/DELETE /pushrules/global/{kind}/{ruleId}``,
``.../enabled``, ``.../actions``, ``before``/``after``): what GET answers afterwards, what
``/sync`` delivers as ``m.push_rules`` account data, and the unread counts they decide."""

from __future__ import annotations

from typing import Any

from tests.support.client import room_with, send, sync
from tests.support.homeserver import Homeserver, User

RULES = "/pushrules/global"


def _ids(rules: list[dict[str, Any]]) -> list[str]:
    return [r["rule_id"] for r in rules]


async def _put(hs: Homeserver, user: User, path: str, body: Any) -> None:
    await hs.ok("PUT", RULES + path, body, token=user.token)


async def test_override_rules_are_placed_by_before_and_after(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    rule = {
        "actions": ["notify"],
        "conditions": [{"kind": "event_match", "key": "type", "pattern": "a"}],
    }
    await _put(homeserver, alice, "/override/one", rule)
    await _put(homeserver, alice, "/override/two", rule)  # newest first
    await _put(homeserver, alice, "/override/three?after=one", rule)
    await _put(homeserver, alice, "/override/zero?before=two", rule)
    override = await homeserver.ok("GET", RULES + "/override/", token=alice.token)
    ids = _ids(override)
    # The master rule first, then the user's in their order, then the other defaults.
    assert ids[:5] == [".m.rule.master", "zero", "two", "one", "three"]
    assert ids[5] == ".m.rule.suppress_notices"
    one = await homeserver.ok("GET", RULES + "/override/one", token=alice.token)
    assert one == {"rule_id": "one", "default": False, "enabled": True, **rule}
    # Moving an existing rule with before: it leaves its old place.
    await _put(homeserver, alice, "/override/three?before=zero", rule)
    ids = _ids(await homeserver.ok("GET", RULES + "/override/", token=alice.token))
    assert ids[:5] == [".m.rule.master", "three", "zero", "two", "one"]
    await homeserver.ok("DELETE", RULES + "/override/zero", token=alice.token)
    ids = _ids(await homeserver.ok("GET", RULES + "/override/", token=alice.token))
    assert ids[:4] == [".m.rule.master", "three", "two", "one"]


async def test_enabled_and_actions_of_defaults_and_own_rules(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    await _put(homeserver, alice, "/override/.m.rule.master/enabled", {"enabled": True})
    assert await homeserver.ok(
        "GET", RULES + "/override/.m.rule.master/enabled", token=alice.token
    ) == {"enabled": True}
    await _put(homeserver, alice, "/underride/.m.rule.message/actions", {"actions": []})
    message = await homeserver.ok("GET", RULES + "/underride/.m.rule.message", token=alice.token)
    assert (message["actions"], message["default"]) == ([], True)
    await _put(homeserver, alice, "/content/cats", {"actions": ["notify"], "pattern": "cat*"})
    await _put(homeserver, alice, "/content/cats/enabled", {"enabled": False})
    cats = await homeserver.ok("GET", RULES + "/content/cats", token=alice.token)
    assert (cats["enabled"], cats["pattern"]) == (False, "cat*")
    # Replacing a rule keeps whether it is enabled.
    await _put(homeserver, alice, "/content/cats", {"actions": [], "pattern": "kitten"})
    cats = await homeserver.ok("GET", RULES + "/content/cats", token=alice.token)
    assert (cats["enabled"], cats["pattern"], cats["actions"]) == (False, "kitten", [])


async def test_bad_push_rule_requests(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    cases: list[tuple[str, str, Any, int, str]] = [
        ("PUT", "/override/.mine", {"actions": []}, 400, "M_UNKNOWN"),
        ("PUT", "/content/x", {"actions": ["notify"]}, 400, "M_BAD_JSON"),  # no pattern
        ("PUT", "/override/x", {"actions": "notify"}, 400, "M_BAD_JSON"),
        ("PUT", "/override/x", {"actions": ["shout"]}, 400, "M_UNKNOWN"),
        ("PUT", "/override/x", {"actions": [], "conditions": [1]}, 400, "M_BAD_JSON"),
        ("PUT", "/override/x?before=nope", {"actions": []}, 400, "M_UNKNOWN"),
        ("PUT", "/override/x?after=.m.rule.master", {"actions": []}, 400, "M_UNKNOWN"),
        ("PUT", "/nokind/x", {"actions": []}, 400, "M_UNRECOGNIZED"),
        ("PUT", "/override/x/colour", {}, 400, "M_UNRECOGNIZED"),
        ("GET", "/override/missing", None, 404, "M_NOT_FOUND"),
        ("DELETE", "/override/missing", None, 404, "M_NOT_FOUND"),
        ("DELETE", "/override/.m.rule.master", None, 400, "M_UNKNOWN"),
        ("PUT", "/override/missing/enabled", {"enabled": True}, 404, "M_NOT_FOUND"),
        ("PUT", "/override/.m.rule.master/enabled", {"enabled": "yes"}, 400, "M_BAD_JSON"),
    ]
    for method, path, body, status, errcode in cases:
        got, answer = await homeserver.call(method, RULES + path, body, token=alice.token)
        assert (got, answer.get("errcode")) == (status, errcode), (method, path, answer)
    # Nothing of the above changed the rules; m.push_rules is not written directly.
    got, answer = await homeserver.call(
        "PUT", f"/user/{alice.user_id}/account_data/m.push_rules", {}, token=alice.token
    )
    assert (got, answer["errcode"]) == (400, "M_BAD_JSON")
    override = await homeserver.ok("GET", RULES + "/override/", token=alice.token)
    assert all(r["default"] for r in override)


async def test_own_rules_decide_unread_counts_and_reach_sync(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    carol = await homeserver.register("carol")
    room_id = await room_with(homeserver, alice, bob, carol)  # 3 members: .m.rule.message
    await send(homeserver, bob, room_id, "one")
    await send(homeserver, carol, room_id, "two")
    first = await sync(homeserver, alice)
    counts = first["rooms"]["join"][room_id]["unread_notifications"]
    assert counts == {"notification_count": 2, "highlight_count": 0}
    # Mute bob (a sender rule), highlight the word "deploy" (a content rule).
    await _put(homeserver, alice, f"/sender/{bob.user_id}", {"actions": []})
    await _put(
        homeserver,
        alice,
        "/content/deploy",
        {"actions": ["notify", {"set_tweak": "highlight"}], "pattern": "deploy"},
    )
    await send(homeserver, carol, room_id, "deploy now")
    later = await sync(homeserver, alice, since=first["next_batch"])
    counts = later["rooms"]["join"][room_id]["unread_notifications"]
    assert counts == {"notification_count": 2, "highlight_count": 1}
    pushed = {e["type"]: e["content"] for e in later["account_data"]["events"]}
    sender = pushed["m.push_rules"]["global"]["sender"]
    assert _ids(sender) == [bob.user_id]
    # Disabling the sender rule: bob's message counts again (the counts of the earlier
    # rules, remembered for the room, are not reused). An incremental sync reports a
    # room's counts only with news of the room, as Synapse's: ask a whole one.
    await _put(homeserver, alice, f"/sender/{bob.user_id}/enabled", {"enabled": False})
    again = await sync(homeserver, alice)
    counts = again["rooms"]["join"][room_id]["unread_notifications"]
    assert counts == {"notification_count": 3, "highlight_count": 1}
    # Bob's rules are his own.
    assert _ids((await homeserver.ok("GET", RULES + "/", token=bob.token))["sender"]) == []
