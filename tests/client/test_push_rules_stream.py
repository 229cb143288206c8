"""The ``push_rules`` stream on one process: an edit is one ``[user_id]`` row, the rules
in force are the ``push_rules`` table's (what ``GET /pushrules`` shows) and clients still
receive them as ``m.push_rules`` account data; a database from before migration 0027
keeps each user's rules (moved from their account data)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from roomstream.storage import DatabaseConfig, connect
from tests.support.client import sync
from tests.support.homeserver import Homeserver, make_config, serve_homeserver
from tests.support.migrations import downgrade_txn


def _sender_rules(document: dict[str, Any]) -> list[str]:
    return [r["rule_id"] for r in document["global"]["sender"]]


async def test_an_edit_is_one_push_rules_row_and_reaches_sync(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    streams = hs.engine.streams
    before = streams.current_token("push_rules", "main")
    await hs.ok(
        "PUT", f"/pushrules/global/sender/{bob.user_id}", {"actions": []}, token=alice.token
    )
    await hs.ok(
        "PUT", "/pushrules/global/room/!r:test.local", {"actions": ["notify"]}, token=alice.token
    )
    after = streams.current_token("push_rules", "main")
    updates, _, _ = await streams.get_updates("push_rules", "main", before, after, 100)
    # One row per edit, the user's (the table keeps one row per user: the latest).
    assert after - before == 2
    assert [row for _, row in updates] == [(alice.user_id,)]
    assert _sender_rules(await hs.ok("GET", "/pushrules/", token=alice.token)) == [bob.user_id]
    # A refused edit writes nothing.
    status, _ = await hs.call(
        "PUT", "/pushrules/global/sender/.m.bad", {"actions": []}, token=alice.token
    )
    assert status == 400
    assert streams.current_token("push_rules", "main") == after
    events = (await sync(hs, alice))["account_data"]["events"]
    copy = next(e["content"] for e in events if e["type"] == "m.push_rules")
    assert copy == await hs.ok("GET", "/pushrules/", token=alice.token)


async def test_rules_from_before_the_stream_are_kept(
    db_config: DatabaseConfig, tmp_path: Path
) -> None:
    config = make_config(db_config, tmp_path)
    async with serve_homeserver(config) as hs:
        alice = await hs.register("alice")
        bob = await hs.register("bob")
        body = {"actions": []}
        await hs.ok("PUT", f"/pushrules/global/sender/{bob.user_id}", body, token=alice.token)
        rules = await hs.ok("GET", "/pushrules/", token=alice.token)
    # Back to the schema before 0027: the rules are only m.push_rules account data.
    database = connect(db_config)
    try:
        await database.run_interaction("downgrade", downgrade_txn, 27)
    finally:
        await database.close()
    async with serve_homeserver(config) as hs:
        assert await hs.ok("GET", "/pushrules/", token=alice.token) == rules
        # And they go on being edited from there.
        await hs.ok("DELETE", f"/pushrules/global/sender/{bob.user_id}", token=alice.token)
        assert _sender_rules(await hs.ok("GET", "/pushrules/", token=alice.token)) == []


async def test_every_initial_sync_carries_the_rules(homeserver: Homeserver) -> None:
    """As Synapse: the defaults for a user who never changed them; an incremental sync
    only when they changed."""
    hs = homeserver
    alice = await hs.register("alice")
    first = await sync(hs, alice)
    pushed = {e["type"]: e["content"] for e in first["account_data"]["events"]}
    assert pushed["m.push_rules"] == await hs.ok("GET", "/pushrules/", token=alice.token)
    await hs.ok("PUT", f"/user/{alice.user_id}/account_data/org.example.x", {}, token=alice.token)
    later = await sync(hs, alice, since=first["next_batch"])
    assert [e["type"] for e in later["account_data"]["events"]] == ["org.example.x"]
    body = {"actions": ["notify"], "pattern": "cake"}
    await hs.ok("PUT", "/pushrules/global/content/cake", body, token=alice.token)
    changed = await sync(hs, alice, since=later["next_batch"])
    content = next(
        e["content"] for e in changed["account_data"]["events"] if e["type"] == "m.push_rules"
    )
    assert content["global"]["content"][0]["rule_id"] == "cake"
