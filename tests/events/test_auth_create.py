"""Rule 1: the ``m.room.create`` event, per room version."""

from __future__ import annotations

from typing import Any

import pytest

from roomstream.events.auth import check_auth_rules
from roomstream.events.model import Event
from roomstream.events.room_versions import ROOM_V10, ROOM_V11, ROOM_V12, RoomVersion
from tests.support.auth import ALICE, BOB, refused, versions


def create_event(version: RoomVersion, **overrides: Any) -> Event:
    """A valid create event for ``version``; ``overrides`` replace top-level fields."""
    content: dict[str, Any] = {"room_version": version.identifier}
    if version is ROOM_V10:
        content["creator"] = ALICE
    data: dict[str, Any] = {
        "type": "m.room.create",
        "state_key": "",
        "sender": ALICE,
        "content": content,
        "prev_events": [],
        "auth_events": [],
        "depth": 1,
    }
    if not version.room_id_from_create_event:
        data["room_id"] = "!room:a.example"
    for key, value in overrides.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return Event(data, version, "$create")


def with_content(version: RoomVersion, **changes: Any) -> Event:
    event = create_event(version)
    content = dict(event.content)
    for key, value in changes.items():
        if value is None:
            content.pop(key, None)
        else:
            content[key] = value
    return create_event(version, content=content)


@versions()
def test_valid_create_is_allowed(version: RoomVersion) -> None:
    check_auth_rules(create_event(version), {})


@versions()
def test_create_with_prev_events_is_refused(version: RoomVersion) -> None:
    event = create_event(version, prev_events=["$earlier"])
    refused(lambda: check_auth_rules(event, {}), "prev_events")


@pytest.mark.parametrize("version", [ROOM_V10, ROOM_V11], ids=["10", "11"])
def test_room_id_domain_must_match_sender_domain_before_v12(version: RoomVersion) -> None:
    event = create_event(version, room_id="!room:b.example")
    refused(lambda: check_auth_rules(event, {}), "room_id domain", "sender")
    check_auth_rules(create_event(version, room_id="!other:a.example"), {})


@pytest.mark.parametrize("version", [ROOM_V10, ROOM_V11], ids=["10", "11"])
def test_room_id_is_required_before_v12(version: RoomVersion) -> None:
    event = create_event(version, room_id=None)
    refused(lambda: check_auth_rules(event, {}), "room_id")


def test_v12_create_must_not_have_a_room_id() -> None:
    event = create_event(ROOM_V12, room_id="!room:a.example")
    refused(lambda: check_auth_rules(event, {}), "must not have a room_id")
    # Its room ID is derived from its event ID instead.
    assert create_event(ROOM_V12).room_id == "!create"


@versions()
@pytest.mark.parametrize("declared", ["1", "9", "13", "org.example.custom", 12, None])
def test_unrecognised_room_version_is_refused(version: RoomVersion, declared: object) -> None:
    # None removes the key: an absent room_version means version 1, which is unsupported.
    event = with_content(version, room_version=declared)
    refused(lambda: check_auth_rules(event, {}), "room_version")


def test_room_version_must_match_the_rules_applied() -> None:
    event = with_content(ROOM_V12, room_version="11")
    refused(lambda: check_auth_rules(event, {}), "room_version '11'", "'12'")


def test_v10_requires_creator() -> None:
    event = with_content(ROOM_V10, creator=None)
    refused(lambda: check_auth_rules(event, {}), "creator")


@pytest.mark.parametrize("version", [ROOM_V11, ROOM_V12], ids=["11", "12"])
def test_v11_and_later_need_no_creator(version: RoomVersion) -> None:
    event = create_event(version)
    assert "creator" not in event.content
    check_auth_rules(event, {})


@pytest.mark.parametrize(
    "additional",
    [[], [BOB], [BOB, "@carol:c.example:8448"], ["@x:[::1]"]],
    ids=["empty", "one", "with-port", "ipv6"],
)
def test_v12_additional_creators_valid(additional: list[str]) -> None:
    check_auth_rules(with_content(ROOM_V12, additional_creators=additional), {})


@pytest.mark.parametrize(
    "additional",
    [BOB, [BOB, 3], ["bob:b.example"], ["@bob"], ["@:b.example"], ["@bo b:b.example"], {}],
    ids=["string", "non-string", "no-sigil", "no-server", "empty-local", "space", "object"],
)
def test_v12_additional_creators_invalid(additional: object) -> None:
    event = with_content(ROOM_V12, additional_creators=additional)
    refused(lambda: check_auth_rules(event, {}), "additional_creators")


@pytest.mark.parametrize("version", [ROOM_V10, ROOM_V11], ids=["10", "11"])
def test_additional_creators_is_ignored_before_v12(version: RoomVersion) -> None:
    # Not a field of these versions: no validation, and (see the power tests) no power.
    check_auth_rules(with_content(version, additional_creators="not a list"), {})


@versions()
def test_create_ignores_auth_events(version: RoomVersion) -> None:
    # Rule 1 decides alone; whatever the caller passes is irrelevant.
    other = create_event(version)
    check_auth_rules(create_event(version), {("m.room.create", ""): other})
