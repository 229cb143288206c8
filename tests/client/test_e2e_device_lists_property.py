"""``/sync``'s ``device_lists`` against a naive model of who shares a room with whom over
time, on both engines.

Random runs of joins, leaves, device changes (a device renamed: a ``device_lists`` row)
and incremental syncs by three users in two public rooms. The model keeps every room's
joined members after each step; for a sync of U covering steps ``(t0, t1]``:

- ``changed`` must hold every user sharing a room with U at t1 (or U) whose devices changed
  in the range, and every user sharing a room with U at t1 who did not at some step of the
  range (U may have missed key changes meanwhile); and nobody else than U and users
  sharing a room with U at t1;
- ``left`` must hold every user who shared a room with U at t0 and shares none at t1, and
  nobody who shares one at t1 (or U), nor anyone who was never in a room with U in the
  range.

The server may over-report within those bounds (a client re-queries keys it already had,
or stops tracking a user it did not track); it must never miss one.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.homeserver import Homeserver, User

USERS = 3
ROOMS = 2
_runs = itertools.count()

Op = tuple[str, int, int]
operations = st.lists(
    st.tuples(
        st.sampled_from(["join", "leave", "change", "sync", "sync"]),
        st.integers(0, USERS - 1),
        st.integers(0, ROOMS - 1),
    ),
    min_size=1,
    max_size=14,
)


@dataclass
class Model:
    """Joined members of each room after each step, and each step's device changes."""

    joined: list[list[set[int]]] = field(default_factory=list)
    changes: list[set[int]] = field(default_factory=list)

    def step(self, rooms: list[set[int]], changed: set[int]) -> int:
        self.joined.append([set(r) for r in rooms])
        self.changes.append(changed)
        return len(self.joined) - 1

    def sharing(self, user: int, step: int) -> set[int]:
        """Who shares a room with ``user`` after ``step`` (``user`` excluded)."""
        return {m for room in self.joined[step] if user in room for m in room} - {user}

    def co_members(self, user: int, t0: int, t1: int) -> set[int]:
        """Everyone in a room, at some step of [t0, t1], that ``user`` was in at some
        step of [t0, t1]."""
        rooms = {r for s in range(t0, t1 + 1) for r, m in enumerate(self.joined[s]) if user in m}
        return {m for s in range(t0, t1 + 1) for r in rooms for m in self.joined[s][r]}


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=operations)
async def test_device_lists_match_who_shares_a_room(homeserver: Homeserver, ops: list[Op]) -> None:
    hs = homeserver
    run = next(_runs)
    users: list[User] = [await hs.register(f"dl{run}u{i}") for i in range(USERS)]
    ids = {u.user_id: i for i, u in enumerate(users)}
    rooms = [
        (await hs.ok("POST", "/createRoom", {"preset": "public_chat"}, token=users[0].token))[
            "room_id"
        ]
        for _ in range(ROOMS)
    ]
    members: list[set[int]] = [{0} for _ in range(ROOMS)]
    model = Model()
    start = model.step(members, set())
    tokens: dict[int, tuple[str, int]] = {}
    for i, user in enumerate(users):
        tokens[i] = ((await hs.ok("GET", "/sync", token=user.token))["next_batch"], start)

    for op, who, room in ops:
        user = users[who]
        if op == "join" and who not in members[room]:
            await hs.ok("POST", f"/join/{rooms[room]}", {}, token=user.token)
            members[room].add(who)
            model.step(members, set())
        elif op == "leave" and who in members[room]:
            await hs.ok("POST", f"/rooms/{rooms[room]}/leave", {}, token=user.token)
            members[room].discard(who)
            model.step(members, set())
        elif op == "change":
            name = {"display_name": f"renamed {len(model.joined)}"}
            await hs.ok("PUT", f"/devices/{user.device_id}", name, token=user.token)
            model.step(members, {who})
        elif op == "sync":
            since, t0 = tokens[who]
            body = await hs.ok("GET", f"/sync?since={since}&timeout=0", token=user.token)
            t1 = len(model.joined) - 1
            tokens[who] = (body["next_batch"], t1)
            lists = body.get("device_lists", {"changed": [], "left": []})
            changed = {ids[u] for u in lists["changed"]}
            left = {ids[u] for u in lists["left"]}
            assert set(lists["changed"]) <= set(ids) and set(lists["left"]) <= set(ids)
            now = model.sharing(who, t1)
            changed_keys = {u for s in range(t0 + 1, t1 + 1) for u in model.changes[s]}
            came = {u for u in now if any(u not in model.sharing(who, s) for s in range(t0, t1))}
            context = (op, who, t0, t1, model.joined[t0 : t1 + 1], changed, left)
            # Never missed...
            assert changed_keys & (now | {who}) <= changed, context
            assert came <= changed, context
            assert model.sharing(who, t0) - now <= left, context
            # ...and nothing out of bounds.
            assert changed <= now | {who}, context
            assert not left & (now | {who}), context
            assert left <= model.co_members(who, t0, t1), context
