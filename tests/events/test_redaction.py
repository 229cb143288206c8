"""The redaction algorithm for room versions 10, 11 and 12."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roomstream.events.hashing import add_content_hash, compute_event_id
from roomstream.events.redaction import redact
from roomstream.events.room_versions import ROOM_V10, ROOM_V11, ROOM_V12, RoomVersion

BASE: dict[str, Any] = {
    "event_id": "$legacy",
    "type": "x.custom",
    "room_id": "!r:example.org",
    "sender": "@u:example.org",
    "state_key": "",
    "hashes": {"sha256": "h"},
    "signatures": {"example.org": {"ed25519:a_1": "s"}},
    "depth": 5,
    "prev_events": ["$p"],
    "auth_events": ["$a"],
    "origin_server_ts": 7,
    "origin": "example.org",
    "membership": "join",
    "prev_state": [],
    "unsigned": {"age_ts": 1, "replaces_state": "$x"},
    "age_ts": 1,
    "redacts": "$target",
    "extra": "dropped",
    "content": {"anything": 1},
}
COMMON_KEPT = {
    "event_id",
    "type",
    "room_id",
    "sender",
    "state_key",
    "content",
    "hashes",
    "signatures",
    "depth",
    "prev_events",
    "auth_events",
    "origin_server_ts",
}


def test_top_level_keys_v10() -> None:
    assert set(redact(BASE, ROOM_V10)) == COMMON_KEPT | {"origin", "membership", "prev_state"}


@pytest.mark.parametrize("version", [ROOM_V11, ROOM_V12])
def test_top_level_keys_v11_and_later(version: RoomVersion) -> None:
    # origin, membership and prev_state lose protection; redacts is not top-level any more.
    assert set(redact(BASE, version)) == COMMON_KEPT


MEMBER = {
    "membership": "join",
    "displayname": "Alice",
    "join_authorised_via_users_server": "@admin:example.org",
    "third_party_invite": {"display_name": "alice", "signed": {"mxid": "@a:b", "token": "t"}},
}
POWER_LEVELS = {
    "ban": 50,
    "events": {"m.room.name": 50},
    "events_default": 0,
    "invite": 0,
    "kick": 50,
    "redact": 50,
    "state_default": 50,
    "users": {"@a:b": 100},
    "users_default": 0,
    "notifications": {"room": 50},
}
CREATE = {"creator": "@a:b", "room_version": "10", "m.federate": False, "predecessor": {}}

CONTENT_CASES: list[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]] = [
    # (type, content, kept in v10, kept in v11+)
    (
        "m.room.member",
        MEMBER,
        {"membership": "join", "join_authorised_via_users_server": "@admin:example.org"},
        {
            "membership": "join",
            "join_authorised_via_users_server": "@admin:example.org",
            "third_party_invite": {"signed": {"mxid": "@a:b", "token": "t"}},
        },
    ),
    ("m.room.create", CREATE, {"creator": "@a:b"}, CREATE),
    (
        "m.room.join_rules",
        {"join_rule": "restricted", "allow": [{"type": "m.room_membership"}], "x": 1},
        {"join_rule": "restricted", "allow": [{"type": "m.room_membership"}]},
        {"join_rule": "restricted", "allow": [{"type": "m.room_membership"}]},
    ),
    (
        "m.room.power_levels",
        POWER_LEVELS,
        {k: v for k, v in POWER_LEVELS.items() if k not in ("invite", "notifications")},
        {k: v for k, v in POWER_LEVELS.items() if k != "notifications"},
    ),
    (
        "m.room.history_visibility",
        {"history_visibility": "shared", "x": 1},
        {"history_visibility": "shared"},
        {"history_visibility": "shared"},
    ),
    ("m.room.redaction", {"redacts": "$t", "reason": "spam"}, {}, {"redacts": "$t"}),
    ("m.room.aliases", {"aliases": ["#a:b"]}, {}, {}),  # special case ended in v6
    ("m.room.message", {"body": "hi", "msgtype": "m.text"}, {}, {}),
    ("m.room.name", {"name": "Room"}, {}, {}),
]


@pytest.mark.parametrize(("event_type", "content", "v10", "v11"), CONTENT_CASES)
def test_content_rules(
    event_type: str, content: dict[str, Any], v10: dict[str, Any], v11: dict[str, Any]
) -> None:
    event = dict(BASE, type=event_type, content=content)
    assert redact(event, ROOM_V10)["content"] == v10
    assert redact(event, ROOM_V11)["content"] == v11
    assert redact(event, ROOM_V12)["content"] == v11


def test_third_party_invite_without_signed_keeps_empty_object() -> None:
    # Matches Synapse and ruma; both agreeing is what keeps event IDs interoperable.
    event = dict(
        BASE, type="m.room.member", content={"membership": "invite", "third_party_invite": {"x": 1}}
    )
    assert redact(event, ROOM_V11)["content"] == {"membership": "invite", "third_party_invite": {}}
    event["content"] = {"membership": "invite", "third_party_invite": "not an object"}
    assert redact(event, ROOM_V11)["content"] == {"membership": "invite"}


def test_v12_create_without_room_id() -> None:
    event = {k: v for k, v in BASE.items() if k != "room_id"}
    event.update(type="m.room.create", content={"room_version": "12", "additional_creators": []})
    redacted = redact(event, ROOM_V12)
    assert "room_id" not in redacted
    assert redacted["content"] == {"room_version": "12", "additional_creators": []}


def test_input_not_modified_and_odd_content() -> None:
    before = copy.deepcopy(BASE)
    redact(BASE, ROOM_V10)
    redact(BASE, ROOM_V11)
    assert before == BASE
    assert redact(dict(BASE, content="nope"), ROOM_V11)["content"] == {}
    assert redact({"type": "m.room.member"}, ROOM_V10) == {"type": "m.room.member", "content": {}}


json_leaf = st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text(max_size=5)
json_value = st.recursive(
    json_leaf,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
    max_leaves=10,
)
content_keys = st.sampled_from(
    [
        "membership",
        "creator",
        "join_rule",
        "allow",
        "users",
        "invite",
        "redacts",
        "body",
        "history_visibility",
        "join_authorised_via_users_server",
        "third_party_invite",
        "x",
    ]
)
events = st.fixed_dictionaries(
    {
        "type": st.sampled_from([t for t, *_ in CONTENT_CASES] + ["x.other"]),
        "room_id": st.just("!r:example.org"),
        "sender": st.just("@u:example.org"),
        "content": st.dictionaries(content_keys, json_value, max_size=6),
        "depth": st.integers(0, 100),
        "origin_server_ts": st.integers(0, 2**40),
        "prev_events": st.just(["$p"]),
        "auth_events": st.just(["$a"]),
    },
    optional={
        "state_key": st.text(max_size=3),
        "origin": st.just("example.org"),
        "membership": st.just("join"),
        "prev_state": st.just([]),
        "unsigned": st.dictionaries(st.text(max_size=4), json_value, max_size=2),
        "redacts": st.just("$t"),
        "junk": json_value,
    },
)


@settings(max_examples=200)
@given(events, st.sampled_from([ROOM_V10, ROOM_V11, ROOM_V12]))
def test_redaction_is_idempotent_and_keeps_event_id(
    event: dict[str, Any], version: RoomVersion
) -> None:
    add_content_hash(event)
    once = redact(event, version)
    assert redact(once, version) == once
    assert compute_event_id(once, version) == compute_event_id(event, version)
