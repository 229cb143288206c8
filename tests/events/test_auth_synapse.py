"""The authorization rules of room versions 1 to 12 against Synapse's ``event_auth``.

Generated rooms (create event, power levels -- with the stringy levels rooms before v10
may hold --, join rules of every kind, memberships of three users on three servers) and
a generated event to authorise: roomstream's :func:`check_auth_rules` and Synapse's
``check_state_dependent_auth_rules`` must agree on allow or refuse for every version.
Where Synapse itself fails with an error other than an authorization error (it reads an
unreadable level with ``int()``), the example says nothing and is skipped. One known,
documented divergence is left out of the comparison (``docs/auth.md``, "Not covered
here"): Synapse also refuses a membership whose *target* is on another server than the
creator's in an ``m.federate: false`` room; roomstream makes only the spec's sender check.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, note, settings
from hypothesis import strategies as st

from roomstream.errors import AuthError
from roomstream.events.auth import check_auth_rules
from roomstream.events.hashing import compute_event_id
from roomstream.events.model import Event, StateKey
from roomstream.events.room_versions import KNOWN_ROOM_VERSIONS, RoomVersion

synapse_versions = pytest.importorskip("synapse.api.room_versions")
synapse_events = pytest.importorskip("synapse.events")
synapse_event_auth = pytest.importorskip("synapse.event_auth")
synapse_errors = pytest.importorskip("synapse.api.errors")

VERSIONS = [KNOWN_ROOM_VERSIONS[str(n)] for n in range(1, 13)]
ALICE, BOB, CAROL = "@alice:a.example", "@bob:b.example", "@carol:c.example"
USERS = [ALICE, BOB, CAROL]
MEMBERSHIPS = ["join", "invite", "leave", "ban", "knock"]
JOIN_RULES = ["public", "invite", "knock", "restricted", "knock_restricted", "private"]
NAMED = ["users_default", "events_default", "state_default", "ban", "kick", "redact", "invite"]


def levels(version: RoomVersion, *, in_state: bool = False) -> st.SearchStrategy[Any]:
    ints = st.sampled_from([0, 10, 49, 50, 51, 100, 101])
    if version.enforce_int_power_levels:
        # From v10 a stringy level is refused, so none is in the room's state.
        return ints if in_state else ints | st.sampled_from(["50"])
    # Before v10 Synapse reads levels with int(): digit strings count, floats truncate.
    return ints | st.sampled_from(["50", "100", " 75 ", True]) | st.builds(float, ints)


class Builder:
    """Turns dicts into a pair of events, ours and Synapse's, with the same ID."""

    def __init__(self, version: RoomVersion) -> None:
        self.version = version
        self.theirs_version = synapse_versions.KNOWN_ROOM_VERSIONS[version.identifier]
        self.counter = 0
        self.room_id = "!room:a.example"

    def build(self, data: dict[str, Any], server: str = "a.example") -> tuple[Event, Any]:
        data = dict(data)
        self.counter += 1
        data.setdefault("depth", self.counter)
        data.setdefault("origin_server_ts", self.counter)
        data.setdefault("prev_events", [])
        data.setdefault("auth_events", [])
        data["hashes"] = {"sha256": "aGFzaA"}
        data["signatures"] = {}
        if not (self.version.room_id_from_create_event and data["type"] == "m.room.create"):
            data["room_id"] = self.room_id
        if self.version.event_ids_in_pdu:
            data["event_id"] = f"$e{self.counter}:{server}"
            data["prev_events"] = [[e, {}] for e in data["prev_events"]]
            data["auth_events"] = [[e, {}] for e in data["auth_events"]]
        ours = Event(data, self.version, compute_event_id(data, self.version))
        theirs = synapse_events.make_event_from_dict(copy.deepcopy(data), self.theirs_version)
        assert theirs.event_id == ours.event_id
        if data["type"] == "m.room.create" and self.version.room_id_from_create_event:
            self.room_id = "!" + ours.event_id[1:]
        return ours, theirs


@st.composite
def scenarios(draw: st.DrawFn, version: RoomVersion) -> tuple[Event, Any, list[Event], list[Any]]:
    builder = Builder(version)
    level = levels(version)
    state_level = levels(version, in_state=True)
    create_content: dict[str, Any] = {"room_version": version.identifier}
    if not version.implicit_room_creator:
        create_content["creator"] = ALICE
    federate = draw(st.sampled_from([None, True, False]))
    if federate is not None:
        create_content["m.federate"] = federate
    create = builder.build(
        {"type": "m.room.create", "state_key": "", "sender": ALICE, "content": create_content}
    )
    ours_state, theirs_state = [create[0]], [create[1]]

    def add(data: dict[str, Any]) -> None:
        ours, theirs = builder.build(data, data["sender"].partition(":")[2])
        ours_state.append(ours)
        theirs_state.append(theirs)

    if draw(st.booleans()):
        content: dict[str, Any] = {
            name: draw(state_level) for name in draw(st.lists(st.sampled_from(NAMED), unique=True))
        }
        listable = [BOB, CAROL] if version.privileged_creators else USERS
        content["users"] = {
            u: draw(state_level) for u in draw(st.lists(st.sampled_from(listable), unique=True))
        }
        if draw(st.booleans()):
            content["events"] = {
                "m.room.topic": draw(state_level),
                "m.room.power_levels": draw(state_level),
            }
        if draw(st.booleans()):
            content["notifications"] = {"room": draw(state_level)}
        add({"type": "m.room.power_levels", "state_key": "", "sender": ALICE, "content": content})
    join_rule = draw(st.sampled_from([None, *JOIN_RULES]))
    if join_rule is not None:
        add(
            {
                "type": "m.room.join_rules",
                "state_key": "",
                "sender": ALICE,
                "content": {"join_rule": join_rule, "allow": []},
            }
        )
    for user in USERS:
        membership = draw(st.sampled_from([None, *MEMBERSHIPS]))
        if membership is not None:
            add(
                {
                    "type": "m.room.member",
                    "state_key": user,
                    "sender": user,
                    "content": {"membership": membership},
                }
            )

    sender = draw(st.sampled_from(USERS))
    event_type = draw(
        st.sampled_from(
            [
                "m.room.member",
                "m.room.power_levels",
                "m.room.aliases",
                "m.room.redaction",
                "m.room.message",
                "m.room.topic",
                "m.room.join_rules",
            ]
        )
    )
    data: dict[str, Any] = {"type": event_type, "sender": sender, "content": {}}
    if event_type == "m.room.member":
        data["state_key"] = draw(st.sampled_from(USERS))
        data["content"]["membership"] = draw(st.sampled_from(MEMBERSHIPS))
        if draw(st.booleans()):
            data["content"]["join_authorised_via_users_server"] = draw(st.sampled_from(USERS))
        # The creator's first join follows the create event directly.
        if draw(st.booleans()):
            data["prev_events"] = [create[0].event_id]
    elif event_type == "m.room.power_levels":
        data["state_key"] = ""
        data["content"] = {
            name: draw(level) for name in draw(st.lists(st.sampled_from(NAMED), unique=True))
        }
        data["content"]["users"] = {
            u: draw(level) for u in draw(st.lists(st.sampled_from([BOB, CAROL]), unique=True))
        }
        if draw(st.booleans()):
            data["content"]["notifications"] = {"room": draw(level)}
    elif event_type == "m.room.aliases":
        data["state_key"] = draw(st.sampled_from(["", "a.example", "b.example"]))
        data["content"] = {"aliases": ["#x:a.example"]}
    elif event_type == "m.room.redaction":
        target = (
            f"$target:{draw(st.sampled_from(['a.example', 'b.example']))}"
            if version.event_ids_in_pdu
            else "$target"
        )
        if version.updated_redaction_rules:
            data["content"]["redacts"] = target
        else:
            data["redacts"] = target
    elif event_type in ("m.room.topic", "m.room.join_rules"):
        data["state_key"] = draw(st.sampled_from(["", ALICE, BOB]))
        data["content"] = {"join_rule": "public", "topic": "t"}
    # v1, v2: the event ID's server may differ from the sender's (as in redactions).
    server = draw(st.sampled_from([sender.partition(":")[2], "b.example"]))
    candidate, theirs_candidate = builder.build(data, server)
    return candidate, theirs_candidate, ours_state, theirs_state


def _state_map(events: list[Event]) -> dict[StateKey, Event]:
    return {e.state_tuple: e for e in events}


@pytest.mark.parametrize("version", VERSIONS, ids=[v.identifier for v in VERSIONS])
@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(data=st.data())
def test_auth_rules_agree_with_synapse(version: RoomVersion, data: st.DataObject) -> None:
    event, theirs_event, state, theirs_state = data.draw(scenarios(version))
    note(f"event: {event.data}")
    note(f"state: {[e.data for e in state]}")
    create = state[0]
    assume(
        not (
            create.content.get("m.federate", True) is False
            and event.type == "m.room.member"
            and event.state_key is not None
            and event.state_key.partition(":")[2] != create.sender.partition(":")[2]
        )
    )
    try:
        synapse_event_auth.check_state_dependent_auth_rules(theirs_event, theirs_state)
        synapse_allows = True
    except synapse_errors.SynapseError:
        synapse_allows = False
    except (ValueError, TypeError, KeyError, AttributeError):
        assume(False)  # Synapse cannot decide (an unreadable level): no oracle
        raise
    try:
        check_auth_rules(event, _state_map(state))
        we_allow = True
    except AuthError:
        we_allow = False
    assert we_allow == synapse_allows
