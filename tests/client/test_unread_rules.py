"""Push-rule evaluation of the server-default rules against a naive oracle (the default
rules written out by hand as the spec describes them), and the filter module's pure
parts (glob patterns, event_fields paths)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roomstream.client.filtering import (
    EventFilter,
    parse_field_path,
    parse_sync_filter,
    project_fields,
)
from roomstream.client.pushrules import default_push_rules
from roomstream.client.unread import PushContext, count_unread, evaluate
from roomstream.errors import MatrixError

USER = "@alice:test"
OTHERS = ("@bob:test", "@mod:test")
ALPHABET = "abcilnoAL @.*!_-"


def _word_in(text: str, needle: str) -> bool:
    """Naive: ``needle`` occurs (case-insensitively) with a non-word character or the
    text's end on each side."""
    low, target = text.lower(), needle.lower()
    for start in range(len(low) - len(target) + 1):
        if low[start : start + len(target)] != target:
            continue
        before = low[start - 1] if start else " "
        after = low[start + len(target)] if start + len(target) < len(low) else " "
        if not (before.isalnum() or before == "_") and not (after.isalnum() or after == "_"):
            return True
    return False


def oracle(event: dict[str, Any], name: str | None, count: int, power: int) -> tuple[bool, bool]:
    kind, content = event["type"], event["content"]
    body = content.get("body")
    body = body if isinstance(body, str) else None
    intentional = "m.mentions" in content
    mentions = content.get("m.mentions")
    mentions = mentions if isinstance(mentions, dict) else {}
    msgtype = content.get("msgtype")
    if isinstance(msgtype, str) and msgtype.lower() == "m.notice":
        return False, False
    if kind == "m.room.member":
        invite = content.get("membership") == "invite" and event.get("state_key") == USER
        return invite, False
    user_ids = mentions.get("user_ids")
    if isinstance(user_ids, list) and USER in user_ids:
        return True, True
    if not intentional and name and body is not None and _word_in(body, name):
        return True, True
    if mentions.get("room") is True and power >= 50:
        return True, True
    if not intentional and body is not None and _word_in(body, "@room") and power >= 50:
        return True, True
    if kind == "m.room.tombstone" and event.get("state_key") == "":
        return True, True
    if kind == "m.reaction" or (kind == "m.room.server_acl" and event.get("state_key") == ""):
        return False, False
    relates = content.get("m.relates_to")
    if isinstance(relates, dict) and relates.get("rel_type") == "m.replace":
        return False, False  # an edit (exactly that rel_type) notifies no one
    if not intentional and body is not None and _word_in(body, "alice"):
        return True, True
    if kind == "m.call.invite":
        return True, False
    if kind == "m.room.message" and count == 2:
        return True, False
    return kind in ("m.room.message", "m.room.encrypted"), False


mentions_values = st.sampled_from(
    [None, {}, {"user_ids": [USER]}, {"user_ids": USER}, {"room": True}, {"room": "true"}]
)


@st.composite
def events(draw: st.DrawFn) -> dict[str, Any]:
    content: dict[str, Any] = {}
    if draw(st.booleans()):
        content["body"] = draw(
            st.one_of(
                st.text(ALPHABET, max_size=20),
                st.sampled_from(["hi alice!", "@room now", "Alice", "xalice", "hey A*ce."]),
            )
        )
    msgtype = draw(st.sampled_from([None, "m.text", "m.notice", "M.Notice", "m.notice2"]))
    if msgtype is not None:
        content["msgtype"] = msgtype
    mention = draw(mentions_values)
    if mention is not None:
        content["m.mentions"] = mention
    rel_type = draw(st.sampled_from([None, "m.replace", "M.Replace", "m.thread", 3]))
    if rel_type is not None:
        content["m.relates_to"] = {"rel_type": rel_type, "event_id": "$original"}
    if draw(st.booleans()):
        content["membership"] = draw(st.sampled_from(["invite", "join"]))
    event: dict[str, Any] = {
        "type": draw(
            st.sampled_from(
                [
                    "m.room.message",
                    "m.room.encrypted",
                    "m.room.member",
                    "m.reaction",
                    "m.room.tombstone",
                    "m.call.invite",
                    "m.room.server_acl",
                    "org.example",
                ]
            )
        ),
        "sender": draw(st.sampled_from([USER, *OTHERS])),
        "room_id": "!r",
        "content": content,
    }
    state_key = draw(st.sampled_from([None, "", USER, "@bob:test"]))
    if state_key is not None:
        event["state_key"] = state_key
    return event


@settings(max_examples=400, deadline=None)
@given(
    st.lists(events(), max_size=8),
    st.sampled_from([None, "", "Alice", "A*ce", "al.c"]),
    st.integers(1, 4),
)
def test_default_rules_agree_with_the_oracle(
    batch: list[dict[str, Any]], name: str | None, count: int
) -> None:
    rules = default_push_rules(USER)
    levels = {"users": {"@mod:test": 100}, "users_default": 0}
    ctx = PushContext(USER, name, count, levels)
    expected_n = expected_h = 0
    for event in batch:
        power = 100 if event["sender"] == "@mod:test" else 0
        want = oracle(event, name, count, power)
        assert evaluate(rules, event, ctx) == want, event
        if event["sender"] != USER:
            expected_n += want[0]
            expected_h += want[1]
    assert count_unread(rules, batch, ctx) == (expected_n, expected_h)


def test_default_override_rules_are_synapses_in_order() -> None:
    """The intentional-mention rules and .m.rule.suppress_edits are where Synapse has
    them (order decides: a mention in an edit still highlights)."""
    override = default_push_rules(USER)["global"]["override"]
    assert [r["rule_id"] for r in override] == [
        ".m.rule.master",
        ".m.rule.suppress_notices",
        ".m.rule.invite_for_me",
        ".m.rule.member_event",
        ".m.rule.is_user_mention",
        ".m.rule.contains_display_name",
        ".m.rule.is_room_mention",
        ".m.rule.roomnotif",
        ".m.rule.tombstone",
        ".m.rule.reaction",
        ".m.rule.room.server_acl",
        ".m.rule.suppress_edits",
    ]
    rules = {r["rule_id"]: r for r in override}
    assert rules[".m.rule.is_user_mention"]["conditions"] == [
        {"kind": "event_property_contains", "key": "content.m\\.mentions.user_ids", "value": USER}
    ]
    assert rules[".m.rule.is_room_mention"]["conditions"][0] == {
        "kind": "event_property_is",
        "key": "content.m\\.mentions.room",
        "value": True,
    }
    assert rules[".m.rule.suppress_edits"]["actions"] == []
    ctx = PushContext(USER, "Alice", 3, {"users": {"@mod:test": 100}})
    edit = {
        "type": "m.room.message",
        "sender": "@bob:test",
        "content": {
            "body": "* fixed",
            "m.new_content": {"body": "fixed"},
            "m.relates_to": {"rel_type": "m.replace", "event_id": "$original"},
        },
    }
    assert evaluate(rules_doc := default_push_rules(USER), edit, ctx) == (False, False)
    mentioning = {**edit, "content": {**edit["content"], "m.mentions": {"user_ids": [USER]}}}
    assert evaluate(rules_doc, mentioning, ctx) == (True, True)
    room_mention = {**edit, "sender": "@mod:test"}
    room_mention["content"] = {**edit["content"], "m.mentions": {"room": True}}
    assert evaluate(rules_doc, room_mention, ctx) == (True, True)


def _naive_glob(pattern: str, value: str) -> bool:
    if not pattern:
        return not value
    if pattern[0] == "*":
        return any(_naive_glob(pattern[1:], value[i:]) for i in range(len(value) + 1))
    return bool(value) and pattern[0] == value[0] and _naive_glob(pattern[1:], value[1:])


@settings(max_examples=300, deadline=None)
@given(st.text("ab.*", max_size=6), st.text("ab.", max_size=6))
def test_type_patterns_match_like_a_naive_glob(pattern: str, value: str) -> None:
    assert EventFilter(types=(pattern,)).type_allowed(value) == _naive_glob(pattern, value)
    assert EventFilter(not_types=(pattern,)).type_allowed(value) != _naive_glob(pattern, value)


def test_field_paths_and_projection() -> None:
    assert parse_field_path("content.body") == ("content", "body")
    assert parse_field_path("content.m\\.relates_to") == ("content", "m.relates_to")
    assert parse_field_path("content.a\\\\.b") == ("content", "a\\", "b")
    for bad in ("content.\\q", "a..b", "", "trailing\\"):
        with pytest.raises(MatrixError):
            parse_field_path(bad)
    event = {"type": "t", "content": {"a": {"b": 1, "c": 2}, "n": 5}, "sender": "@x"}
    paths = [("content", "a", "b"), ("content", "n", "deeper"), ("type",), ("missing",)]
    assert project_fields(event, paths) == {"content": {"a": {"b": 1}}, "type": "t"}


def test_parse_sync_filter_defaults_and_clamping() -> None:
    parsed = parse_sync_filter({"room": {"timeline": {"limit": 5000}}, "unknown": 1})
    assert parsed.timeline.limit == 1000 and not parsed.include_leave
    assert parsed.event_format == "client" and parsed.event_fields is None
    assert EventFilter(types=()).type_allowed("m.room.message") is False
