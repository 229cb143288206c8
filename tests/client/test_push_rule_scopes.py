"""Push rules are read per scope; the only scope is ``global``. An unknown scope (the
long-gone ``device``, or anything else) is an unrecognised request: ``400
M_UNRECOGNIZED``, as Synapse answers, not 404."""

from __future__ import annotations

from tests.support.homeserver import Homeserver


async def test_unknown_push_rule_scope_is_400_unrecognized(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    rules = await homeserver.ok("GET", "/pushrules/global/", token=alice.token)
    assert set(rules) >= {"override", "underride", "content", "room", "sender"}
    for scope in ("device", "foo", "GLOBAL"):
        status, body = await homeserver.call("GET", f"/pushrules/{scope}/", token=alice.token)
        assert (status, body["errcode"]) == (400, "M_UNRECOGNIZED"), (scope, body)
