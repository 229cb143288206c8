"""Every read, for every user, returns exactly what the naive oracle allows.

Random rooms (``tests/support/reading_scenario.py``: joins, leaves, invites, kicks, bans,
rejoins, visibility changes, messages, redactions, forks, a redaction before its target)
on both engines. For each user (members, ex-members, the invited, one who never joined)
the test compares with the oracle, which evaluates the spec's rules from
``EventStore.get_state_at`` per event:

- back pagination (pages of 3) and forward pagination (pages of 4), whole history;
- sync from every token taken during the script (whole and with a limit of 2):
  events, ``limited``, the user's own membership changes;
- the latest events of the latest rooms (limit 3) and ``limited``;
- context around every event the user may see (2 before, 2 after) and refusal of the
  others; single events; redacted events pruned with ``redacted_because``.

Mutants (``test_mutants_are_caught``): each replaces one piece of the visibility rules
(``shared`` ignoring "joined later", ``shared`` visible to everyone, ``invited`` treated
as ``joined``, ``world_readable`` treated as ``shared``, the visibility event's
"before or after" case dropped, the own-membership "before or after" case dropped,
"joined later" counting earlier joins too (as if any past member could read shared
history), membership taken after instead of
before the event); each must make the comparison fail on a fixed set of scripts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roomstream.errors import MatrixError
from roomstream.events.signing import load_or_create_signing_key
from roomstream.reading import RoomReader, read_side_participants
from roomstream.reading import reader as reader_module
from roomstream.reading import visibility as visibility_module
from roomstream.rooms.engine import RoomEngine
from roomstream.storage import DatabaseConfig, connect, prepare_database
from roomstream.streams import StreamSet
from tests.support.reading_scenario import SERVER, Move, Oracle, PlayedRoom, Player, scripts


async def check_room(engine: RoomEngine, reader: RoomReader, played: PlayedRoom) -> None:
    oracle = await Oracle.build(engine, played)
    room_id = played.room_id
    current = await engine.store.get_current_state(room_id)
    for user in played.users.values():
        visible = oracle.visible(user)
        ids = [e.event.event_id for e in visible]
        # Back pagination, pages of 3.
        seen: list[str] = []
        token = None
        while True:
            chunk = await reader.paginate(user, room_id, token, direction="b", limit=3)
            seen.extend(e["event_id"] for e in chunk.events)
            if chunk.end is None:
                break
            token = chunk.end
        assert seen == list(reversed(ids)), f"back pagination for {user}"
        # Forward pagination, pages of 4.
        seen = []
        token = None
        while True:
            chunk = await reader.paginate(user, room_id, token, direction="f", limit=4)
            seen.extend(e["event_id"] for e in chunk.events)
            if chunk.end is None:
                break
            token = chunk.end
        assert seen == ids, f"forward pagination for {user}"
        # The latest events (sliding sync's read), and back pagination from its prev_batch.
        for limit in (1, 3):
            page = (await reader.latest_pages(user, [room_id], limit=limit))[room_id]
            assert [e["event_id"] for e in page.events] == ids[-limit:], f"latest for {user}"
            assert page.limited == (len(ids) > limit)
            older = await reader.paginate(user, room_id, page.prev_batch, limit=1000)
            assert [e["event_id"] for e in older.events] == list(reversed(ids[:-limit]))

        # Sync from each token.
        membership_id = current.get(("m.room.member", user))
        membership = None
        if membership_id is not None:
            membership = (await engine.store.get_event(membership_id)).content.get(  # type: ignore[union-attr]
                "membership"
            )
        own = oracle.own_membership_events.get(user, [])
        for since in played.tokens:
            position = since.position("main")
            expected = sorted((e for e in visible if e.stream > position), key=lambda e: e.stream)
            own_since = [ev.event_id for s, ev in own if s > position]
            for limit in (100, 2):
                result = await reader.sync(user, since, timeline_limit=limit)
                assert [e["event_id"] for e in result.membership_changes] == own_since
                room = result.rooms.get(room_id)
                if room is None:
                    assert not own_since
                    assert membership != "join" or not expected, f"sync for {user} missed"
                    continue
                want = [e.event.event_id for e in expected][-limit:]
                assert [e["event_id"] for e in room.events] == want, f"sync for {user}"
                assert room.limited == (len(expected) > limit)

        # Latest rooms.
        page = await reader.latest_rooms(user, room_limit=5, event_limit=3, state="none")
        by_room = {r.room_id: r for r in page.rooms}
        if membership in ("join", "leave", "ban"):
            timeline = by_room[room_id]
            assert [e["event_id"] for e in timeline.events] == ids[-3:], f"latest for {user}"
            assert timeline.limited == (len(ids) > 3)
        elif membership == "invite":
            assert by_room[room_id].events == []
        else:
            assert room_id not in by_room

        # Context, single events, redactions.
        allowed = set(ids)
        for index, e in enumerate(oracle.events):
            event_id = e.event.event_id
            served = await reader.get_event(user, event_id)
            if event_id not in allowed:
                assert served is None, f"{user} may not see {event_id}"
                with pytest.raises(MatrixError):
                    await reader.context(user, room_id, event_id, before=2, after=2)
                continue
            assert served is not None
            if e.redacted_by is not None:
                assert served["unsigned"]["redacted_because"]["event_id"] == e.redacted_by
                if e.event.type == "m.room.message":
                    assert served["content"] == {}
            else:
                assert "redacted_because" not in served.get("unsigned", {})
                assert served["content"] == e.event.content
            if index % 3 == 0:
                context = await reader.context(user, room_id, event_id, before=2, after=2)
                at = ids.index(event_id)
                assert [x["event_id"] for x in context.events_before] == list(
                    reversed(ids[max(0, at - 2) : at])
                )
                assert [x["event_id"] for x in context.events_after] == ids[at + 1 : at + 3]


async def run_scripts(
    db_config: DatabaseConfig, tmp_path: Path, cases: list[tuple[list[Move], str]]
) -> None:
    database = connect(db_config)
    try:
        await prepare_database(database)
        streams = await StreamSet.open(database, "main", {})
        key = load_or_create_signing_key(tmp_path / "keys", SERVER)
        engine = RoomEngine(
            database, streams, SERVER, "main", key, participants=read_side_participants()
        )
        reader = RoomReader.for_engine(engine)
        player = Player(engine, key)
        # Rooms of earlier examples share the database; users are fresh per room.
        player.rooms = await database.run_interaction(
            lambda t: t.query_one("SELECT COUNT(*) FROM rooms")[0]
        )
        for script, version in cases:
            played = await player.play(script, version)
            await check_room(engine, reader, played)
    finally:
        await database.close()


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(script=scripts, version=st.sampled_from(["10", "12"]))
def test_reads_match_the_oracle(
    db_config: DatabaseConfig, tmp_path: Path, script: list[Move], version: str
) -> None:
    asyncio.run(run_scripts(db_config, tmp_path, [(script, version)]))


# -- mutants ------------------------------------------------------------------------------

#: Scripts that between them exercise every rule and edge case.
FIXED: list[tuple[list[Move], str]] = [
    (  # shared history seen by later joiners; joined visibility hides it
        [("message", "alice"), ("join", "bob"), ("message", "bob"), ("hv", "joined"),
         ("message", "alice"), ("leave", "bob"), ("message", "alice"), ("join", "carol"),
         ("message", "carol")],
        "12",
    ),
    (  # shared history after a member left is not theirs
        [("join", "bob"), ("message", "bob"), ("leave", "bob"), ("message", "alice"),
         ("invite", "carol"), ("message", "alice")],
        "11",
    ),
    (  # invited visibility, invites, kicks, bans, rejoin
        [("hv", "invited"), ("invite", "bob"), ("message", "alice"), ("join", "bob"),
         ("message", "bob"), ("kick", "bob"), ("message", "alice"), ("join", "bob"),
         ("ban", "carol"), ("message", "alice"), ("invite", "dave"), ("message", "alice")],
        "10",
    ),
    (  # world_readable for people who never joined; visibility changes back and forth
        [("hv", "world_readable"), ("message", "alice"), ("hv", "joined"),
         ("message", "alice"), ("hv", "world_readable"), ("join", "dave"),
         ("leave", "dave"), ("message", "alice")],
        "12",
    ),
    (  # own membership events under joined visibility; forks
        [("hv", "joined"), ("invite", "carol"), ("join", "carol"), ("message", "carol"),
         ("leave", "carol"), ("fork", "alice", "message", 2, "shared"),
         ("fork", "alice", "hv", 1, "world_readable"), ("message", "alice"),
         ("join", "bob"), ("redact", 0), ("early_redaction",)],
        "12",
    ),
    (  # a late chain lands in the middle: the membership it carries ends where it ends
        [("message", "alice"), ("message", "alice"), ("message", "alice"),
         ("late_chain", "bob", "join", 2, 3), ("message", "alice"), ("message", "alice"),
         ("message", "alice"), ("message", "bob"), ("hv", "joined"),
         ("late_chain", "carol", "join", 1, 2), ("message", "alice"), ("message", "alice"),
         ("message", "carol")],
        "12",
    ),
]  # fmt: skip


def _mutant_shared_ignores_later(visibility: int, membership: str | None, later: bool) -> bool:
    if visibility == visibility_module.SHARED:
        return membership == "join"
    return _original_allowed(visibility, membership, later)


def _mutant_shared_for_all(visibility: int, membership: str | None, later: bool) -> bool:
    if visibility == visibility_module.SHARED:
        return True
    return _original_allowed(visibility, membership, later)


def _mutant_invited_as_joined(visibility: int, membership: str | None, later: bool) -> bool:
    if visibility == visibility_module.INVITED:
        return membership == "join"
    return _original_allowed(visibility, membership, later)


def _mutant_world_readable_as_shared(visibility: int, membership: str | None, later: bool) -> bool:
    if visibility == visibility_module.WORLD_READABLE:
        return membership == "join" or later
    return _original_allowed(visibility, membership, later)


_original_allowed = visibility_module.allowed
_original_membership_at = reader_module._View.membership_at


def _patch_visible(monkeypatch: pytest.MonkeyPatch, drop: str) -> None:
    def visible(self: Any, row: Any) -> bool:
        position = row.position
        membership = self.membership_at(position)
        later = self.joined_later(position)
        if visibility_module.allowed(row.visibility, membership, later):
            return True
        after = row.visibility_after
        if (
            drop != "hv"
            and after is not None
            and visibility_module.allowed(after, membership, later)
        ):
            return True
        if drop != "own" and row.member_user == self.user_id:
            return visibility_module.allowed(row.visibility, row.membership, later)
        return False

    monkeypatch.setattr(reader_module._View, "visible", visible)


MUTANTS: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    "shared ignores joined-later": lambda m: _patch_allowed(m, _mutant_shared_ignores_later),
    "shared visible to all": lambda m: _patch_allowed(m, _mutant_shared_for_all),
    "invited as joined": lambda m: _patch_allowed(m, _mutant_invited_as_joined),
    "world_readable as shared": lambda m: _patch_allowed(m, _mutant_world_readable_as_shared),
    "no before-or-after for the visibility event": lambda m: _patch_visible(m, "hv"),
    "no before-or-after for own membership": lambda m: _patch_visible(m, "own"),
    "joined later counts any join, earlier ones too": lambda m: m.setattr(
        reader_module._View, "joined_later", lambda self, p: self.last_join is not None
    ),
    "membership after the event": lambda m: m.setattr(
        reader_module._View, "membership_at", _membership_after
    ),
}


def _membership_after(view: Any, position: tuple[int, int]) -> str | None:
    # The interval holding the next event: the membership after this one, mostly.
    index = reader_module.bisect.bisect_right(view._positions, position)
    if index < len(view._positions):
        return view._memberships[index]  # type: ignore[no-any-return]
    return _original_membership_at(view, position)  # type: ignore[no-any-return]


def _patch_allowed(monkeypatch: pytest.MonkeyPatch, mutant: Callable[..., bool]) -> None:
    monkeypatch.setattr(visibility_module, "allowed", mutant)
    monkeypatch.setattr(reader_module, "allowed", mutant)


async def test_fixed_scripts_match_the_oracle(db_config: DatabaseConfig, tmp_path: Path) -> None:
    await run_scripts(db_config, tmp_path, FIXED)


@pytest.mark.parametrize("engine_name", ["sqlite"], indirect=True)
@pytest.mark.parametrize("mutant", sorted(MUTANTS))
async def test_mutants_are_caught(
    db_config: DatabaseConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mutant: str
) -> None:
    MUTANTS[mutant](monkeypatch)
    with pytest.raises(AssertionError):
        await run_scripts(db_config, tmp_path, FIXED)
