"""``POST /search`` (room events): parse the request, call
:meth:`roomstream.reading.RoomReader.search`, answer as Synapse's ``SearchRestServlet``.

The only category is ``room_events`` (the spec's only one); a request without it answers
``{"search_categories": {}}``. Malformed fields are ``400 M_BAD_JSON``; an unknown key,
``order_by`` or group key ``400 M_INVALID_PARAM`` (Synapse: ``400``), as is a
``next_batch`` this server did not hand out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from aiohttp import web

from roomstream.accounts import Accounts
from roomstream.client.filtering import parse_room_event_filter
from roomstream.client.ignored import IgnoredUsers
from roomstream.client.request import json_response, optional, read_json, required
from roomstream.client.server import Route, authenticate
from roomstream.errors import BadJsonError, InvalidParamError
from roomstream.reading import RoomReader, SearchQuery
from roomstream.reading.search import SEARCH_KEYS

__all__ = ["MAX_SEARCH_TERM", "parse_search", "search_routes"]

#: Longest search term accepted (characters).
MAX_SEARCH_TERM = 1000
_GROUP_KEYS = ("room_id", "sender")


def parse_search(
    category: dict[str, Any], next_batch: str | None, ignored: frozenset[str]
) -> SearchQuery:
    """The ``room_events`` object of a search request as a :class:`SearchQuery`; events of
    ``ignored`` senders are not results (as Synapse's ``filter_events_for_client``)."""
    search_term = required(category, "search_term", str)
    if len(search_term) > MAX_SEARCH_TERM:
        raise InvalidParamError(f"search_term is longer than {MAX_SEARCH_TERM}")
    keys = optional(category, "keys", list, list(SEARCH_KEYS))
    for key in keys:
        if not isinstance(key, str):
            raise BadJsonError("keys must be a list of strings")
        if key not in SEARCH_KEYS:
            raise InvalidParamError(f"unknown search key {key[:100]!r}")
    order = optional(category, "order_by", str, "rank")
    if order not in ("rank", "recent"):
        raise InvalidParamError("order_by must be rank or recent")
    order_by: Literal["rank", "recent"] = "rank" if order == "rank" else "recent"
    event_filter = parse_room_event_filter(optional(category, "filter", dict, {}), "filter.")
    context = optional(category, "event_context", dict)
    before_limit = after_limit = None
    include_profile = False
    if context is not None:
        before_limit = optional(context, "before_limit", int, 5)
        after_limit = optional(context, "after_limit", int, 5)
        include_profile = optional(context, "include_profile", bool, False)
    groupings = optional(category, "groupings", dict, {})
    group_by: list[str] = []
    for group in optional(groupings, "group_by", list, []):
        if not isinstance(group, dict) or not isinstance(group.get("key"), str):
            raise BadJsonError("groupings.group_by must be a list of {key: string}")
        if group["key"] not in _GROUP_KEYS:
            raise InvalidParamError(f"invalid group by key {group['key'][:100]!r}")
        group_by.append(group["key"])

    def keep(fields: Mapping[str, Any]) -> bool:
        sender = fields.get("sender")
        if sender in ignored:
            return False
        return event_filter.type_allowed(str(fields["type"])) and event_filter.sender_allowed(
            None if sender is None else str(sender)
        )

    filters_fields = (
        event_filter.types is not None
        or event_filter.not_types
        or event_filter.senders is not None
        or event_filter.not_senders
        or ignored
    )
    return SearchQuery(
        search_term,
        keys=tuple(dict.fromkeys(keys)),
        order=order_by,
        limit=event_filter.limit or 10,
        rooms=None if event_filter.rooms is None else frozenset(event_filter.rooms),
        not_rooms=frozenset(event_filter.not_rooms),
        keep=keep if filters_fields else None,
        before_limit=before_limit,
        after_limit=after_limit,
        include_profile=include_profile,
        include_state=optional(category, "include_state", bool, False),
        group_by=tuple(dict.fromkeys(group_by)),
        next_batch=next_batch,
    )


def search_routes(
    accounts: Accounts, reader: RoomReader, ignored_users: IgnoredUsers | None
) -> list[Route]:
    async def search(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        body = await read_json(request)
        categories = required(body, "search_categories", dict)
        category = optional(categories, "room_events", dict)
        if category is None:
            return json_response({"search_categories": {}})
        ignored = (
            frozenset() if ignored_users is None else await ignored_users.of(requester.user_id)
        )
        query = parse_search(category, request.query.get("next_batch"), ignored)
        results = await reader.search(requester.user_id, query, device_id=requester.device_id)
        return json_response({"search_categories": {"room_events": results.as_json()}})

    return [Route("POST", "/search", search)]
