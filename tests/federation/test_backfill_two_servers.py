"""Backfill on demand between two real roomstream servers (issue 22 §3, §5): A (SQLite)
holds a room's history; a user of B (each engine) joins later and paginates backwards
past B's join, which makes B ask A for the history (``/backfill``) and serve it through
the visibility records: all of it, in order, once, under ``shared``; nothing from before
the join under ``joined``."""

from __future__ import annotations

from typing import Any

from tests.support.federation_servers import Account, FederatedServer, q
from tests.support.wait import wait_for

HISTORY = 14


async def _room_with_history(alice: Account, visibility: str) -> str:
    room = (
        await alice.ok(
            "POST",
            "/createRoom",
            {
                "preset": "public_chat",
                "initial_state": [
                    {
                        "type": "m.room.history_visibility",
                        "state_key": "",
                        "content": {"history_visibility": visibility},
                    }
                ],
            },
        )
    )["room_id"]
    for i in range(HISTORY):
        await alice.send(room, f"history {i}")
    return str(room)


async def _all_pages(account: Account, room: str, limit: int) -> list[dict[str, Any]]:
    """Every event of the room the account is served paginating backwards from now,
    ``limit`` a page, oldest first; fails on a page repeating an event."""
    seen: list[dict[str, Any]] = []
    ids: set[str] = set()
    token: str | None = None
    for _ in range(100):
        path = f"/rooms/{q(room)}/messages?dir=b&limit={limit}"
        if token is not None:
            path += f"&from={q(token)}"
        answer = await account.ok("GET", path)
        for event in answer["chunk"]:
            assert event["event_id"] not in ids, ("served twice", event)
            ids.add(event["event_id"])
            seen.append(event)
        if "end" not in answer or not answer["chunk"]:
            return list(reversed(seen))
        token = answer["end"]
    raise AssertionError("pagination never ended")


def _bodies(events: list[dict[str, Any]]) -> list[str]:
    return [str(e["content"]["body"]) for e in events if e["type"] == "m.room.message"]


def _details(*servers: FederatedServer) -> Any:
    return lambda: "\n\n".join(f"== {s.label}\n{s.output()}" for s in servers)


async def test_shared_history_is_backfilled_in_order_once(
    servers: tuple[FederatedServer, FederatedServer],
) -> None:
    a, b = servers
    alice = await a.register("alice")
    bob = await b.register("bob")
    room = await _room_with_history(alice, "shared")
    await bob.ok("POST", f"/join/{q(room)}?server_name={q(a.server_name)}", {})
    await alice.send(room, "after the join")

    async def arrived() -> bool:
        return "after the join" in _bodies(await _all_pages(bob, room, 50))

    # B held only the join and what followed; paginating backwards fills in A's history.
    await wait_for(arrived, 60, "A's message on B", details=_details(a, b))
    events = await _all_pages(bob, room, 4)
    assert _bodies(events) == [*(f"history {i}" for i in range(HISTORY)), "after the join"]
    # The join is served after the history, as on A.
    joins = [
        i
        for i, e in enumerate(events)
        if e["type"] == "m.room.member" and e["state_key"] == bob.user_id
    ]
    assert len(joins) == 1
    assert _bodies(events[: joins[0]]) == [f"history {i}" for i in range(HISTORY)]
    # B serves A's timeline, all of it: the room's first state events, which B held as
    # outliers from the join, were decided again when backfill reached them.
    on_a = [e["event_id"] for e in await _all_pages(alice, room, 50)]
    assert [e["event_id"] for e in events] == on_a
    # Paginated again: the same events (backfill stored them once, asks nothing new).
    again = await _all_pages(bob, room, 7)
    assert [e["event_id"] for e in again] == [e["event_id"] for e in events]


async def test_joined_history_stays_hidden_after_backfill(
    servers: tuple[FederatedServer, FederatedServer],
) -> None:
    a, b = servers
    alice = await a.register("alice")
    bob = await b.register("bob")
    room = await _room_with_history(alice, "joined")
    await bob.ok("POST", f"/join/{q(room)}?server_name={q(a.server_name)}", {})
    await alice.send(room, "after the join")

    async def arrived() -> bool:
        return "after the join" in _bodies(await _all_pages(bob, room, 50))

    await wait_for(arrived, 60, "A's message on B", details=_details(a, b))
    events = await _all_pages(bob, room, 4)
    # No message from before the join; the join itself is served. Before it, only what
    # came before the `joined` visibility event (the room's first state events, under
    # the default `shared`) and that event itself (visible under its old value), as A
    # orders them.
    assert _bodies(events) == ["after the join"]
    joins = [
        i
        for i, e in enumerate(events)
        if e["type"] == "m.room.member" and e["state_key"] == bob.user_id
    ]
    assert len(joins) == 1
    assert events[joins[0]]["content"]["membership"] == "join"
    on_a = await _all_pages(alice, room, 50)
    [joined_at] = [
        i
        for i, e in enumerate(on_a)
        if e["type"] == "m.room.history_visibility"
        and e["content"]["history_visibility"] == "joined"
    ]
    before_joined = [e["event_id"] for e in on_a[: joined_at + 1]]
    assert [e["event_id"] for e in events[: joins[0]]] == before_joined
