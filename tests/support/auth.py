"""Builders shared by the ``test_auth_*`` modules: small rooms made of readable events.

Events carry readable IDs (``$create``, ``$e3``) and no hashes or signatures: the rules
are pure, so only the fields they read matter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pytest

from roomstream.errors import AuthError
from roomstream.events.auth import auth_types_for_event, check_auth_rules
from roomstream.events.model import Event, StateKey
from roomstream.events.room_versions import ROOM_V10, ROOM_V11, ROOM_V12, RoomVersion

ALICE = "@alice:a.example"  # the room creator in every scenario
ALICE_FRIEND = "@friend:a.example"  # on the creator's server
BOB = "@bob:b.example"
CAROL = "@carol:c.example"
DAVE = "@dave:d.example"
ERIN = "@erin:e.example"

ALL_VERSIONS = [ROOM_V10, ROOM_V11, ROOM_V12]
VERSION_IDS = [v.identifier for v in ALL_VERSIONS]
PRE_V12 = [ROOM_V10, ROOM_V11]


def versions() -> pytest.MarkDecorator:
    """Parametrize a test over room versions 10, 11 and 12."""
    return pytest.mark.parametrize("version", ALL_VERSIONS, ids=VERSION_IDS)


class Room:
    """A room being built event by event, with its current state.

    ``send`` authorises each event against the current state (so a scenario that does
    not follow the rules fails loudly) and then applies it; ``make`` only builds one,
    for the test to check.
    """

    def __init__(
        self,
        version: RoomVersion,
        creator: str = ALICE,
        *,
        create_content: Mapping[str, Any] | None = None,
    ) -> None:
        self.version = version
        self.state: dict[StateKey, Event] = {}
        self.events: dict[str, Event] = {}
        self._counter = 0
        content: dict[str, Any] = {"room_version": version.identifier}
        if not version.implicit_room_creator:
            content["creator"] = creator
        content.update(create_content or {})
        data: dict[str, Any] = {
            "type": "m.room.create",
            "state_key": "",
            "sender": creator,
            "content": content,
            "prev_events": [],
            "auth_events": [],
            "depth": 1,
        }
        if not version.room_id_from_create_event:
            data["room_id"] = "!room:" + creator.partition(":")[2]
        self.create = Event(data, version, "$create")
        self.room_id = self.create.room_id
        self._apply(self.create)
        self.last_event_id = self.create.event_id

    def _apply(self, event: Event) -> None:
        self.events[event.event_id] = event
        if event.is_state():
            self.state[event.state_tuple] = event
        self.last_event_id = event.event_id

    def make(
        self,
        event_type: str,
        sender: str,
        content: Mapping[str, Any] | None = None,
        *,
        state_key: str | None = None,
        prev_events: list[str] | None = None,
        event_id: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Event:
        """Build an event whose auth_events are chosen by the selection algorithm."""
        self._counter += 1
        content = dict(content or {})
        auth_ids = [
            self.state[key].event_id
            for key in auth_types_for_event(self.version, event_type, state_key, sender, content)
            if key in self.state
        ]
        data: dict[str, Any] = {
            "type": event_type,
            "room_id": self.room_id,
            "sender": sender,
            "content": content,
            "prev_events": prev_events if prev_events is not None else [self.last_event_id],
            "auth_events": auth_ids,
            "depth": self._counter + 1,
        }
        if state_key is not None:
            data["state_key"] = state_key
        data.update(extra or {})
        return Event(data, self.version, event_id or f"$e{self._counter}")

    def member(self, sender: str, target: str, membership: str, **content: Any) -> Event:
        return self.make(
            "m.room.member", sender, {"membership": membership, **content}, state_key=target
        )

    def check(self, event: Event) -> None:
        check_auth_rules(event, self.state)

    def send(self, event: Event) -> Event:
        self.check(event)
        self._apply(event)
        return event

    def force(self, event: Event) -> Event:
        """Put an event into the state without checking it (to set up odd states)."""
        self._apply(event)
        return event

    # Shortcuts for the usual steps.
    def join(self, user: str, **content: Any) -> Event:
        return self.send(self.member(user, user, "join", **content))

    def invite(self, sender: str, target: str) -> Event:
        return self.send(self.member(sender, target, "invite"))

    def set_join_rule(self, rule: str, **content: Any) -> Event:
        return self.send(
            self.make("m.room.join_rules", ALICE, {"join_rule": rule, **content}, state_key="")
        )

    def set_power_levels(self, content: Mapping[str, Any], sender: str = ALICE) -> Event:
        return self.send(self.make("m.room.power_levels", sender, content, state_key=""))


def creator_users(version: RoomVersion, users: Mapping[str, int]) -> dict[str, int]:
    """A ``users`` map giving the creator 100 where the version allows listing them."""
    result = dict(users)
    if not version.privileged_creators:
        result.setdefault(ALICE, 100)
    return result


def standard_room(
    version: RoomVersion,
    *,
    join_rule: str = "public",
    users: Mapping[str, int] | None = None,
    members: Iterable[str] = (),
    power_levels: Mapping[str, Any] | None = None,
) -> Room:
    """Create (by Alice), Alice's join, power levels, join rules, then ``members`` join.

    Power levels: Alice 100 (or infinite in v12), ``users`` as given, other levels default.
    """
    room = Room(version)
    room.join(ALICE)
    content: dict[str, Any] = {"users": creator_users(version, users or {})}
    content.update(power_levels or {})
    room.set_power_levels(content)
    room.set_join_rule("public")
    for user in members:
        room.join(user)
    if join_rule != "public":
        room.set_join_rule(join_rule)
    return room


def refused(action: Callable[[], object], *fragments: str) -> AuthError:
    """Assert ``action`` raises AuthError whose message mentions every fragment."""
    with pytest.raises(AuthError) as info:
        action()
    message = info.value.message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert info.value.errcode == "M_FORBIDDEN"
    return info.value
