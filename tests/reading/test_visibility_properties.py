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

from roomstream.events.signing import load_or_create_signing_key
from roomstream.reading import RoomReader, read_side_participants
from roomstream.reading import timeline_rows as rows_module
from roomstream.reading import visibility as visibility_module
from roomstream.rooms.engine import RoomEngine
from roomstream.storage import DatabaseConfig, connect, prepare_database
from roomstream.streams import StreamSet
from tests.support.reading_scenario import (
    FIXED,
    SERVER,
    Move,
    Player,
    check_room,
    scripts,
)


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
            "test_query", lambda t: t.query_one("SELECT COUNT(*) FROM rooms")[0]
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
_original_membership_at = rows_module._View.membership_at


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

    monkeypatch.setattr(rows_module._View, "visible", visible)


MUTANTS: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    "shared ignores joined-later": lambda m: _patch_allowed(m, _mutant_shared_ignores_later),
    "shared visible to all": lambda m: _patch_allowed(m, _mutant_shared_for_all),
    "invited as joined": lambda m: _patch_allowed(m, _mutant_invited_as_joined),
    "world_readable as shared": lambda m: _patch_allowed(m, _mutant_world_readable_as_shared),
    "no before-or-after for the visibility event": lambda m: _patch_visible(m, "hv"),
    "no before-or-after for own membership": lambda m: _patch_visible(m, "own"),
    "joined later counts any join, earlier ones too": lambda m: m.setattr(
        rows_module._View, "joined_later", lambda self, p: self.last_join is not None
    ),
    "membership after the event": lambda m: m.setattr(
        rows_module._View, "membership_at", _membership_after
    ),
}


def _membership_after(view: Any, position: tuple[int, int]) -> str | None:
    # The interval holding the next event: the membership after this one, mostly.
    index = rows_module.bisect.bisect_right(view._positions, position)
    if index < len(view._positions):
        return view._memberships[index]  # type: ignore[no-any-return]
    return _original_membership_at(view, position)  # type: ignore[no-any-return]


def _patch_allowed(monkeypatch: pytest.MonkeyPatch, mutant: Callable[..., bool]) -> None:
    monkeypatch.setattr(visibility_module, "allowed", mutant)
    monkeypatch.setattr(rows_module, "allowed", mutant)


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
