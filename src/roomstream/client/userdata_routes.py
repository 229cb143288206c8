"""Handlers for account data, tags, filters, typing, receipts, read markers, to-device
messages."""

from __future__ import annotations

from aiohttp import web

from roomstream.accounts import Accounts, Requester
from roomstream.client.filtering import parse_sync_filter
from roomstream.client.notifier import Notifier
from roomstream.client.pushrules import PUSH_RULES
from roomstream.client.request import json_response, optional, read_json, required
from roomstream.client.rooms import RoomService
from roomstream.client.server import Route, authenticate
from roomstream.client.store import ClientStore
from roomstream.client.userdata import UserData
from roomstream.client.writes import UserDataWriter
from roomstream.errors import (
    BadJsonError,
    ForbiddenError,
    InvalidParamError,
    NotFoundError,
)
from roomstream.grammar import is_user_id

__all__ = ["userdata_routes"]

RECEIPT_TYPES = ("m.read", "m.read.private")
MAX_KEY_LENGTH = 255


def _own(request: web.Request, requester: Requester) -> str:
    user_id = request.match_info["user_id"]
    if user_id != requester.user_id:
        raise ForbiddenError("cannot access another user's data")
    return user_id


def _key(request: web.Request, name: str) -> str:
    value = request.match_info[name]
    if not value or len(value) > MAX_KEY_LENGTH:
        raise InvalidParamError(f"{name} must be 1-{MAX_KEY_LENGTH} chars")
    return value


def userdata_routes(
    accounts: Accounts,
    rooms: RoomService,
    store: ClientStore,
    data: UserData,
    notifier: Notifier,
    writes: UserDataWriter,
) -> list[Route]:
    async def put_account_data(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        user_id = _own(request, requester)
        room_id = request.match_info.get("room_id")
        content = await read_json(request)
        if room_id is None and request.match_info["data_type"] == PUSH_RULES:
            # The push-rules API keeps this document consistent (MSC4010: refused here).
            raise BadJsonError("m.push_rules is changed through the /pushrules API")
        if room_id is not None:
            await rooms.require_joined(requester, room_id)
        await writes.put_account_data(user_id, room_id, _key(request, "data_type"), content)
        return json_response({})

    async def get_account_data(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        user_id = _own(request, requester)
        content = await data.get_account_data(
            user_id, request.match_info.get("room_id"), _key(request, "data_type")
        )
        if content is None:
            raise NotFoundError("no account data of that type")
        return json_response(content)

    async def get_tags(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        user_id = _own(request, requester)
        tags = await data.get_account_data(user_id, request.match_info["room_id"], "m.tag")
        return json_response({"tags": (tags or {}).get("tags", {})})

    async def change_tag(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        user_id = _own(request, requester)
        room_id, tag = request.match_info["room_id"], _key(request, "tag")
        body = await read_json(request) if request.method == "PUT" else {}
        await rooms.require_joined(requester, room_id)
        current = await data.get_account_data(user_id, room_id, "m.tag") or {}
        tags = dict(current.get("tags") or {})
        if request.method == "PUT":
            order = body.get("order")
            if order is not None and (
                isinstance(order, bool) or not isinstance(order, int | float)
            ):
                raise BadJsonError("order must be a number")
            tags[tag] = {} if order is None else {"order": order}
        else:
            tags.pop(tag, None)
        await writes.put_account_data(user_id, room_id, "m.tag", {"tags": tags})
        return json_response({})

    async def post_filter(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        user_id = _own(request, requester)
        definition = await read_json(request)
        parse_sync_filter(definition)  # rejects a malformed filter (400 M_BAD_JSON)
        filter_id = await store.add_filter(user_id, definition)
        return json_response({"filter_id": str(filter_id)})

    async def get_filter(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        user_id = _own(request, requester)
        raw = request.match_info["filter_id"]
        found = (
            await store.get_filter(user_id, int(raw))
            if raw.isascii() and raw.isdigit() and len(raw) < 18
            else None
        )
        if found is None:
            raise NotFoundError("no such filter")
        return json_response(found)

    async def put_typing(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        _own(request, requester)
        room_id = request.match_info["room_id"]
        body = await read_json(request)
        typing_now = required(body, "typing", bool)
        timeout = optional(body, "timeout", int, 30_000)
        await rooms.require_joined(requester, room_id)
        await writes.set_typing(room_id, requester.user_id, typing_now, max(0, timeout))
        return json_response({})

    async def post_receipt(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        room_id = request.match_info["room_id"]
        receipt_type = request.match_info["receipt_type"]
        body = await read_json(request)
        event_id = _key(request, "event_id")
        thread_id = optional(body, "thread_id", str)
        await rooms.require_joined(requester, room_id)
        if thread_id is not None:
            await _check_thread(room_id, receipt_type, event_id, thread_id)
        if receipt_type == "m.fully_read":
            await writes.put_account_data(
                requester.user_id,
                room_id,
                "m.fully_read",
                {"event_id": event_id},
            )
        elif receipt_type in RECEIPT_TYPES:
            await writes.put_receipt(room_id, receipt_type, requester.user_id, event_id, thread_id)
        else:
            raise InvalidParamError(f"unknown receipt type {receipt_type}")
        return json_response({})

    async def _check_thread(room_id: str, receipt_type: str, event_id: str, thread_id: str) -> None:
        """A threaded receipt as Synapse accepts it: a non-empty ``thread_id``, not on
        ``m.fully_read``, and naming the thread the event is in (``main``: an event in no
        thread; a thread root: the root, its replies, or what relates to them)."""
        if not thread_id:
            raise InvalidParamError("thread_id must be a non-empty string")
        if receipt_type == "m.fully_read":
            raise InvalidParamError("thread_id is not compatible with m.fully_read receipts")
        if receipt_type not in RECEIPT_TYPES:
            raise InvalidParamError(f"unknown receipt type {receipt_type}")
        if not await data.event_in_thread(room_id, event_id, thread_id):
            raise InvalidParamError(f"event_id {event_id} is not related to thread {thread_id}")

    async def read_markers(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        room_id = request.match_info["room_id"]
        body = await read_json(request)
        await rooms.require_joined(requester, room_id)
        fully_read = optional(body, "m.fully_read", str)
        if fully_read is not None:
            await writes.put_account_data(
                requester.user_id, room_id, "m.fully_read", {"event_id": fully_read}
            )
        for receipt_type in RECEIPT_TYPES:
            event_id = optional(body, receipt_type, str)
            if event_id is not None:
                await writes.put_receipt(room_id, receipt_type, requester.user_id, event_id, None)
        return json_response({})

    async def send_to_device(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        body = await read_json(request)
        messages = required(body, "messages", dict)
        for user_id, by_device in messages.items():
            if not isinstance(by_device, dict) or not all(
                isinstance(c, dict) for c in by_device.values()
            ):
                raise BadJsonError("messages: user -> device -> object")
            if not user_id.endswith(":" + accounts.server_name) and (
                # Other servers' users are reached over federation (m.direct_to_device).
                rooms.remote is None or not is_user_id(user_id)
            ):
                raise InvalidParamError(
                    f"{user_id[:300]!r}: only local users can be reached"
                    if rooms.remote is None
                    else f"{user_id[:300]!r} is not a user ID"
                )
        # Idempotent per sending device and transaction ID, as PUT /send is.
        transaction = (requester.device_id, _key(request, "txn_id"))
        await writes.send_to_device(
            requester.user_id, _key(request, "event_type"), messages, transaction
        )
        return json_response({})

    user = "/user/{user_id}"
    room_data = user + "/rooms/{room_id}/account_data/{data_type}"
    tags = user + "/rooms/{room_id}/tags"
    return [
        Route("PUT", user + "/account_data/{data_type}", put_account_data),
        Route("GET", user + "/account_data/{data_type}", get_account_data),
        Route("PUT", room_data, put_account_data),
        Route("GET", room_data, get_account_data),
        Route("GET", tags, get_tags),
        Route("PUT", tags + "/{tag}", change_tag),
        Route("DELETE", tags + "/{tag}", change_tag),
        Route("POST", user + "/filter", post_filter),
        Route("GET", user + "/filter/{filter_id}", get_filter),
        Route("PUT", "/rooms/{room_id}/typing/{user_id}", put_typing),
        Route("POST", "/rooms/{room_id}/receipt/{receipt_type}/{event_id}", post_receipt),
        Route("POST", "/rooms/{room_id}/read_markers", read_markers),
        Route("PUT", "/sendToDevice/{event_type}/{txn_id}", send_to_device),
    ]
