"""``redaction_applies`` against a naive oracle, over random power levels (``users``,
``users_default``, ``redact``, or no power levels event at all), creators, senders on a
few servers, which server is ours, and redactions naming another event or room."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from roomstream.events.auth import redaction_applies
from roomstream.events.model import Event, StateKey
from roomstream.events.room_versions import ROOM_V10, ROOM_V11, ROOM_V12, RoomVersion

SERVERS = ("a.example", "b.example", "c.example")
USERS = tuple(f"@u{i}:{server}" for server in SERVERS for i in range(3))
ROOM = "!room:a.example"

users = st.sampled_from(USERS)
levels = st.integers(-5, 120)


@dataclass(frozen=True)
class Case:
    version: RoomVersion
    creator: str
    additional_creators: tuple[str, ...]
    #: None: the room has no power levels event.
    power_levels: dict[str, Any] | None
    redaction_sender: str
    target_sender: str
    local_server: str | None
    same_room: bool
    names_target: bool


@st.composite
def cases(draw: st.DrawFn) -> Case:
    power_levels: dict[str, Any] | None = None
    if draw(st.booleans()):
        power_levels = {"users": draw(st.dictionaries(users, levels, max_size=5))}
        if draw(st.booleans()):
            power_levels["users_default"] = draw(levels)
        if draw(st.booleans()):
            power_levels["redact"] = draw(levels)
    return Case(
        version=draw(st.sampled_from((ROOM_V10, ROOM_V11, ROOM_V12))),
        creator=draw(users),
        additional_creators=tuple(draw(st.lists(users, max_size=2))),
        power_levels=power_levels,
        redaction_sender=draw(users),
        target_sender=draw(users),
        local_server=draw(st.sampled_from((None, *SERVERS))),
        same_room=draw(st.booleans() | st.just(True)),
        names_target=draw(st.booleans() | st.just(True)),
    )


def server(user_id: str) -> str:
    return user_id.split(":", 1)[1]


def oracle(case: Case) -> bool:
    """Who may redact the target, listed user by user, straight from the rule's wording."""
    if not (case.same_room and case.names_target):
        return False
    pl = case.power_levels

    def level(user: str) -> float:
        if case.version is ROOM_V12 and user in (case.creator, *case.additional_creators):
            return float("inf")
        if pl is None:
            return 100 if user == case.creator else 0
        return pl["users"][user] if user in pl["users"] else pl.get("users_default", 0)

    redact_level = 50 if pl is None else pl.get("redact", 50)
    moderators = {u for u in USERS if level(u) >= redact_level}
    # A remote server vouches for its own users; ours are checked one by one.
    vouched = {
        u
        for u in USERS
        if server(u) == server(case.target_sender) and server(u) != case.local_server
    }
    return case.redaction_sender in moderators | {case.target_sender} | vouched


def events_of(case: Case) -> tuple[Event, Event, dict[StateKey, Event]]:
    version = case.version
    create_content: dict[str, Any] = {"room_version": version.identifier}
    if version is ROOM_V10:
        create_content["creator"] = case.creator
    if version is ROOM_V12:
        create_content["additional_creators"] = list(case.additional_creators)
    create = Event(
        {"type": "m.room.create", "state_key": "", "sender": case.creator, "room_id": ROOM,
         "content": create_content},
        version,
        "$create",
    )  # fmt: skip
    state: dict[StateKey, Event] = {("m.room.create", ""): create}
    if case.power_levels is not None:
        state[("m.room.power_levels", "")] = Event(
            {"type": "m.room.power_levels", "state_key": "", "sender": case.creator,
             "room_id": ROOM, "content": case.power_levels},
            version,
            "$levels",
        )  # fmt: skip
    target = Event(
        {"type": "m.room.message", "sender": case.target_sender, "content": {"body": "x"},
         "room_id": ROOM if case.same_room else "!other:b.example"},
        version,
        "$target",
    )  # fmt: skip
    redacts = "$target" if case.names_target else "$another"
    redaction_data: dict[str, Any] = {
        "type": "m.room.redaction",
        "sender": case.redaction_sender,
        "room_id": ROOM,
        "content": {"redacts": redacts} if version.updated_redaction_rules else {},
    }
    if not version.updated_redaction_rules:
        redaction_data["redacts"] = redacts
    return Event(redaction_data, version, "$redaction"), target, state


@settings(max_examples=1500, deadline=None)
@given(cases())
def test_redaction_applies_as_the_oracle_says(case: Case) -> None:
    redaction, target, state = events_of(case)
    assert redaction.redacts == ("$target" if case.names_target else "$another")
    got = redaction_applies(redaction, target, state, local_server=case.local_server)
    assert got is oracle(case)


def test_the_repro_case_is_refused() -> None:
    """The defect: a local member at level 0 redacting another local user's message."""
    case = Case(
        ROOM_V11,
        creator="@u0:a.example",
        additional_creators=(),
        power_levels={"users": {"@u0:a.example": 100}},
        redaction_sender="@u1:a.example",
        target_sender="@u0:a.example",
        local_server="a.example",
        same_room=True,
        names_target=True,
    )
    redaction, target, state = events_of(case)
    assert not redaction_applies(redaction, target, state, local_server="a.example")
    # The same pair received from a.example by another server: a.example vouches for it.
    assert redaction_applies(redaction, target, state, local_server="b.example")
