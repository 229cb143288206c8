"""Push rules: the server defaults (spec, "Push Rules: Predefined rules") and the user's
own rules (spec, "Push Rules: API"), as one document ``{"global": {kind: [rule, ...]}}``.

A user's document is stored whole as their global account data of type ``m.push_rules``
(what Synapse sends clients in ``/sync``), so it travels on the ``account_data`` stream
to every process (:class:`~roomstream.client.push_store.PushRulesStore` caches it).
Invariants of a stored document, kept by :func:`with_defaults` on every read:

- each kind lists the user's rules (``default: false``) in priority order, then the
  server defaults of that kind, except ``override``, where ``.m.rule.master`` comes first
  (as Synapse orders them);
- the server defaults are always today's (a default added by a later version appears;
  one removed disappears); only their ``enabled`` and ``actions`` come from the stored
  copy (the user may change those, never a default's conditions).

The editing functions here are pure: each takes a document and returns a new one, or
raises a named error (400 for bad input, 404 for an unknown rule).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from roomstream.errors import BadJsonError, BadRequestError, NotFoundError, UnrecognizedRequestError
from roomstream.events.types import EventTypes

__all__ = [
    "KINDS",
    "PUSH_RULES",
    "PushRuleEdit",
    "check_kind",
    "default_push_rules",
    "delete_rule",
    "find_rule",
    "put_rule",
    "set_actions",
    "set_enabled",
    "with_defaults",
]

#: The account-data type holding a user's document (the type clients see in ``/sync``).
PUSH_RULES = "m.push_rules"
#: Rule kinds, in evaluation order.
KINDS = ("override", "content", "room", "sender", "underride")
_MASTER = ".m.rule.master"
MAX_RULE_ID_LENGTH = 255

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
        # Edits notify no one (the spec's and Synapse's rule, an exact comparison): an
        # edit that mentions the user was already decided by .m.rule.is_user_mention.
        _rule(
            ".m.rule.suppress_edits",
            [],
            [
                {
                    "kind": "event_property_is",
                    "key": "content.m\\.relates_to.rel_type",
                    "value": "m.replace",
                }
            ],
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


def check_kind(scope: str, kind: str) -> None:
    if scope != "global":
        raise UnrecognizedRequestError("only the global push-rule scope exists")
    if kind not in KINDS:
        raise UnrecognizedRequestError(f"unknown push rule kind {kind!r}")


def with_defaults(user_id: str, stored: Mapping[str, Any] | None) -> dict[str, Any]:
    """The user's effective document: their rules from ``stored`` (a stored
    ``m.push_rules`` content, None for never changed) with today's defaults, keeping the
    ``enabled`` and ``actions`` the user gave defaults (see the module invariants).
    Anything malformed in ``stored`` is dropped, never raised: it came from storage."""
    defaults = default_push_rules(user_id)["global"]
    if stored is None:
        return {"global": defaults}
    ruleset = stored.get("global")
    ruleset = ruleset if isinstance(ruleset, Mapping) else {}
    result: dict[str, list[dict[str, Any]]] = {}
    for kind in KINDS:
        rules = ruleset.get(kind)
        rules = [r for r in rules if isinstance(r, Mapping)] if isinstance(rules, list) else []
        changed = {r.get("rule_id"): r for r in rules if r.get("default") is True}
        own = [dict(r) for r in rules if r.get("default") is False and _well_formed(kind, r)]
        base = []
        for rule in defaults[kind]:
            mine = changed.get(rule["rule_id"])
            if mine is not None:
                if isinstance(mine.get("enabled"), bool):
                    rule["enabled"] = mine["enabled"]
                if isinstance(mine.get("actions"), list):
                    rule["actions"] = mine["actions"]
            base.append(rule)
        if kind == "override":
            first = [r for r in base if r["rule_id"] == _MASTER]
            result[kind] = [*first, *own, *(r for r in base if r["rule_id"] != _MASTER)]
        else:
            result[kind] = [*own, *base]
    return {"global": result}


def _well_formed(kind: str, rule: Mapping[str, Any]) -> bool:
    if not isinstance(rule.get("rule_id"), str) or not isinstance(rule.get("actions"), list):
        return False
    if kind == "content":
        return isinstance(rule.get("pattern"), str)
    if kind in ("override", "underride"):
        return isinstance(rule.get("conditions"), list)
    return True


def find_rule(doc: Mapping[str, Any], kind: str, rule_id: str) -> dict[str, Any]:
    for rule in doc["global"][kind]:
        if rule["rule_id"] == rule_id:
            return dict(rule)
    raise NotFoundError("unknown push rule")


def _check_rule_id(rule_id: str) -> None:
    if not rule_id or len(rule_id) > MAX_RULE_ID_LENGTH:
        raise BadRequestError(f"rule_id must be 1-{MAX_RULE_ID_LENGTH} characters")
    if "/" in rule_id or "\\" in rule_id:
        raise BadRequestError("rule_id may not contain slashes")


def check_actions(actions: Any) -> list[Any]:
    """The spec's actions: ``notify``, a ``set_tweak`` object (``value`` optional); the
    legacy ``dont_notify`` and ``coalesce`` are accepted as Synapse does (they notify
    no one)."""
    if not isinstance(actions, list):
        raise BadJsonError("actions must be a list")
    for action in actions:
        if isinstance(action, str):
            if action not in ("notify", "dont_notify", "coalesce"):
                raise BadRequestError(f"unrecognised action {action!r}")
        elif isinstance(action, dict):
            if not isinstance(action.get("set_tweak"), str):
                raise BadRequestError("a tweak action needs set_tweak")
        else:
            raise BadRequestError("an action is a string or an object")
    return actions


def put_rule(
    doc: Mapping[str, Any],
    kind: str,
    rule_id: str,
    body: Mapping[str, Any],
    before: str | None = None,
    after: str | None = None,
) -> dict[str, Any]:
    """``doc`` with the user's rule ``rule_id`` of ``kind`` created or replaced from a
    ``PUT /pushrules/global/{kind}/{ruleId}`` body. Placement: next to ``before`` (just
    above it) or ``after`` (just below it), both user rules of the same kind; with
    neither, a new rule becomes the user's most important of its kind and an existing
    one keeps its place. A new rule is enabled; a replaced one keeps its ``enabled``."""
    _check_rule_id(rule_id)
    if rule_id.startswith("."):
        raise BadRequestError("rule IDs starting with '.' are reserved for server defaults")
    rule: dict[str, Any] = {
        "rule_id": rule_id,
        "default": False,
        "enabled": True,
        "actions": check_actions(body.get("actions")),
    }
    if kind == "content":
        pattern = body.get("pattern")
        if not isinstance(pattern, str) or not pattern:
            raise BadJsonError("a content rule needs a pattern")
        rule["pattern"] = pattern
    elif kind in ("override", "underride"):
        conditions = body.get("conditions", [])
        if not isinstance(conditions, list) or not all(
            isinstance(c, dict) and isinstance(c.get("kind"), str) for c in conditions
        ):
            raise BadJsonError("conditions must be a list of objects with a kind")
        rule["conditions"] = conditions
    result = copy.deepcopy(dict(doc))
    rules: list[dict[str, Any]] = result["global"][kind]
    index = next((i for i, r in enumerate(rules) if r["rule_id"] == rule_id), None)
    if index is not None:
        if rules[index]["default"]:
            raise BadRequestError("server default rules cannot be replaced")
        rule["enabled"] = rules[index].get("enabled", True)
    anchor = before if before is not None else after
    if anchor is not None:
        if anchor.startswith(".") or anchor == rule_id:
            raise BadRequestError("before/after must name another rule of your own")
        if index is not None:
            del rules[index]
        at = next((i for i, r in enumerate(rules) if r["rule_id"] == anchor), None)
        if at is None or rules[at]["default"]:
            raise BadRequestError("before/after rule not found")
        rules.insert(at if before is not None else at + 1, rule)
    elif index is not None:
        rules[index] = rule
    else:
        # Above every other rule of the user's, below .m.rule.master for override.
        first = 1 if kind == "override" and rules and rules[0]["rule_id"] == _MASTER else 0
        rules.insert(first, rule)
    return result


def delete_rule(doc: Mapping[str, Any], kind: str, rule_id: str) -> dict[str, Any]:
    if rule_id.startswith("."):
        raise BadRequestError("server default rules cannot be deleted")
    find_rule(doc, kind, rule_id)
    result = copy.deepcopy(dict(doc))
    result["global"][kind] = [r for r in result["global"][kind] if r["rule_id"] != rule_id]
    return result


def _set(doc: Mapping[str, Any], kind: str, rule_id: str, attr: str, value: Any) -> dict[str, Any]:
    find_rule(doc, kind, rule_id)
    result = copy.deepcopy(dict(doc))
    for rule in result["global"][kind]:
        if rule["rule_id"] == rule_id:
            rule[attr] = value
    return result


def set_enabled(doc: Mapping[str, Any], kind: str, rule_id: str, enabled: Any) -> dict[str, Any]:
    if not isinstance(enabled, bool):
        raise BadJsonError("enabled must be a boolean")
    return _set(doc, kind, rule_id, "enabled", enabled)


def set_actions(doc: Mapping[str, Any], kind: str, rule_id: str, actions: Any) -> dict[str, Any]:
    return _set(doc, kind, rule_id, "actions", check_actions(actions))


@dataclass(frozen=True)
class PushRuleEdit:
    """One edit of a user's rules, as a client asked it (and as it is forwarded to the
    ``push_rules`` writer): ``op`` ``put`` (``body`` is the rule, placed by
    ``before``/``after``), ``delete``, ``enabled`` or ``actions`` (``body`` holds the
    attribute). :meth:`apply` is pure and raises the named errors of this module."""

    op: str
    kind: str
    rule_id: str
    body: Mapping[str, Any] = field(default_factory=dict)
    before: str | None = None
    after: str | None = None

    def apply(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        check_kind("global", self.kind)  # again: a forwarded edit is checked here too
        if self.op == "put":
            return put_rule(doc, self.kind, self.rule_id, self.body, self.before, self.after)
        if self.op == "delete":
            return delete_rule(doc, self.kind, self.rule_id)
        if self.op == "enabled":
            return set_enabled(doc, self.kind, self.rule_id, self.body.get("enabled"))
        if self.op == "actions":
            return set_actions(doc, self.kind, self.rule_id, self.body.get("actions"))
        raise UnrecognizedRequestError(f"unknown push rule edit {self.op!r}")
