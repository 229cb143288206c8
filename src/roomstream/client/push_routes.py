"""Handlers for push rules (``/pushrules/...``), ``/notifications`` and pushers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from roomstream.accounts import Accounts
from roomstream.client.notifications import Notifications
from roomstream.client.push_store import PushRulesStore
from roomstream.client.pushers import PusherStore, parse_pusher
from roomstream.client.pushrules import PushRuleEdit, check_kind, find_rule
from roomstream.client.request import json_response, read_json
from roomstream.client.server import Route, authenticate
from roomstream.errors import InvalidParamError, UnrecognizedRequestError

__all__ = ["push_routes"]

ATTRIBUTES = ("enabled", "actions")
#: Carries out ``/pushers/set`` (user, device, body) on the pushers writer, here or
#: forwarded.
SetPusher = Callable[[str, str | None, dict[str, Any]], Awaitable[None]]
#: ``/notifications`` page size: Synapse's default, and our most.
DEFAULT_LIMIT = 50
MAX_LIMIT = 1000


def _int_param(request: web.Request, name: str) -> int | None:
    raw = request.query.get(name)
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        raise InvalidParamError(f"{name} must be a non-negative integer")
    return int(raw)


def _attribute(request: web.Request) -> str:
    attr = request.match_info["attr"]
    if attr not in ATTRIBUTES:
        raise UnrecognizedRequestError(f"unknown push rule attribute {attr!r}")
    return attr


def push_routes(
    accounts: Accounts,
    push_rules: PushRulesStore,
    notifications: Notifications,
    pushers: PusherStore,
    set_pusher: SetPusher,
) -> list[Route]:
    async def get_pushers(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        found = await pushers.list_for_user(requester.user_id)
        return json_response({"pushers": [p.to_json() for p in found]})

    async def post_pushers_set(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        body = await read_json(request)
        parse_pusher(requester.user_id, body)  # bad input is refused here, not forwarded
        await set_pusher(requester.user_id, requester.device_id, body)
        return json_response({})

    async def get_notifications(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        before = _int_param(request, "from")
        limit = _int_param(request, "limit")
        limit = DEFAULT_LIMIT if limit is None else min(max(limit, 1), MAX_LIMIT)
        only = request.query.get("only")
        if only not in (None, "highlight"):
            raise InvalidParamError("only may be 'highlight'")
        body = await notifications.page(requester.user_id, before, limit, only == "highlight")
        return json_response(body)

    async def get_rules(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        rules = await push_rules.rules_of(requester.user_id)
        scope = request.match_info.get("scope")
        if scope is None:
            return json_response(rules)
        if scope not in rules:
            # Synapse: an unknown scope is an unrecognised request, not a missing one.
            raise UnrecognizedRequestError(f"unknown push rule scope {scope!r}")
        kind = request.match_info.get("kind")
        if kind is None:
            return json_response(rules[scope])
        check_kind(scope, kind)
        return json_response(rules[scope][kind])

    async def get_rule(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        scope, kind = request.match_info["scope"], request.match_info["kind"]
        check_kind(scope, kind)
        rules = await push_rules.rules_of(requester.user_id)
        rule = find_rule(rules, kind, request.match_info["rule_id"])
        attr = request.match_info.get("attr")
        if attr is None:
            return json_response(rule)
        return json_response({attr: rule[_attribute(request)]})

    async def put(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        scope, kind = request.match_info["scope"], request.match_info["kind"]
        rule_id = request.match_info["rule_id"]
        check_kind(scope, kind)
        body = await read_json(request)
        attr = request.match_info.get("attr")
        if attr is not None:
            attribute = _attribute(request)
            change = PushRuleEdit(attribute, kind, rule_id, {attribute: body.get(attribute)})
        else:
            before = request.query.get("before")
            after = request.query.get("after")
            change = PushRuleEdit("put", kind, rule_id, body, before, after)
        await push_rules.edit(requester.user_id, change)
        return json_response({})

    async def delete(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        scope, kind = request.match_info["scope"], request.match_info["kind"]
        rule_id = request.match_info["rule_id"]
        check_kind(scope, kind)
        await push_rules.edit(requester.user_id, PushRuleEdit("delete", kind, rule_id))
        return json_response({})

    base = "/pushrules/{scope}/{kind}/{rule_id}"
    return [
        Route("GET", "/notifications", get_notifications),
        Route("GET", "/pushers", get_pushers),
        Route("POST", "/pushers/set", post_pushers_set),
        Route("GET", "/pushrules/", get_rules),
        Route("GET", "/pushrules/{scope}/", get_rules),
        Route("GET", "/pushrules/{scope}/{kind}/", get_rules),
        Route("GET", base, get_rule),
        Route("PUT", base, put),
        Route("DELETE", base, delete),
        Route("GET", base + "/{attr}", get_rule),
        Route("PUT", base + "/{attr}", put),
    ]
