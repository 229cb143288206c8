"""The server-default push rules (spec, "Push Rules: Predefined rules"), served by
``GET /pushrules/``. Users cannot change them yet; clients (matrix-js-sdk in particular)
need the document to exist."""

from __future__ import annotations

from typing import Any

from roomstream.events.types import EventTypes

__all__ = ["default_push_rules"]

_NOTIFY = ["notify"]
_SOUND = {"set_tweak": "sound", "value": "default"}
_HIGHLIGHT = {"set_tweak": "highlight"}


def _rule(rule_id: str, actions: list[Any], conditions: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "rule_id": rule_id,
        "default": True,
        "enabled": True,
        "conditions": conditions,
        "actions": actions,
    }


def _event_match(key: str, pattern: str) -> dict[str, Any]:
    return {"kind": "event_match", "key": key, "pattern": pattern}


def default_push_rules(user_id: str) -> dict[str, Any]:
    localpart = user_id[1:].partition(":")[0]
    override = [
        _rule(".m.rule.master", [], []) | {"enabled": False},
        _rule(".m.rule.suppress_notices", [], [_event_match("content.msgtype", "m.notice")]),
        _rule(
            ".m.rule.invite_for_me",
            [*_NOTIFY, _SOUND],
            [
                _event_match("type", EventTypes.MEMBER),
                _event_match("content.membership", "invite"),
                _event_match("state_key", user_id),
            ],
        ),
        _rule(".m.rule.member_event", [], [_event_match("type", EventTypes.MEMBER)]),
        _rule(
            ".m.rule.is_user_mention",
            [*_NOTIFY, _SOUND, _HIGHLIGHT],
            [
                {
                    "kind": "event_property_contains",
                    "key": "content.m\\.mentions.user_ids",
                    "value": user_id,
                }
            ],
        ),
        _rule(
            ".m.rule.contains_display_name",
            [*_NOTIFY, _SOUND, _HIGHLIGHT],
            [{"kind": "contains_display_name"}],
        ),
        _rule(
            ".m.rule.is_room_mention",
            [*_NOTIFY, _HIGHLIGHT],
            [
                {"kind": "event_property_is", "key": "content.m\\.mentions.room", "value": True},
                {"kind": "sender_notification_permission", "key": "room"},
            ],
        ),
        _rule(
            ".m.rule.roomnotif",
            [*_NOTIFY, _HIGHLIGHT],
            [
                _event_match("content.body", "@room"),
                {"kind": "sender_notification_permission", "key": "room"},
            ],
        ),
        _rule(
            ".m.rule.tombstone",
            [*_NOTIFY, _HIGHLIGHT],
            [_event_match("type", EventTypes.TOMBSTONE), _event_match("state_key", "")],
        ),
        _rule(".m.rule.reaction", [], [_event_match("type", "m.reaction")]),
        _rule(
            ".m.rule.room.server_acl",
            [],
            [_event_match("type", EventTypes.SERVER_ACL), _event_match("state_key", "")],
        ),
    ]
    content = [
        {
            "rule_id": ".m.rule.contains_user_name",
            "default": True,
            "enabled": True,
            "pattern": localpart,
            "actions": [*_NOTIFY, _SOUND, _HIGHLIGHT],
        }
    ]
    underride = [
        _rule(
            ".m.rule.call",
            [*_NOTIFY, {"set_tweak": "sound", "value": "ring"}],
            [_event_match("type", "m.call.invite")],
        ),
        _rule(
            ".m.rule.room_one_to_one",
            [*_NOTIFY, _SOUND],
            [
                {"kind": "room_member_count", "is": "2"},
                _event_match("type", EventTypes.MESSAGE),
            ],
        ),
        _rule(".m.rule.message", _NOTIFY, [_event_match("type", EventTypes.MESSAGE)]),
        _rule(".m.rule.encrypted", _NOTIFY, [_event_match("type", EventTypes.ENCRYPTED)]),
    ]
    return {
        "global": {
            "override": override,
            "content": content,
            "room": [],
            "sender": [],
            "underride": underride,
        }
    }
