"""Deeply nested JSON bodies, over HTTP on both engines: refused when parsed (``400
M_BAD_JSON``, or ``M_NOT_JSON`` beyond what the decoder reads) on every endpoint, never
stored to fail later (orjson cannot encode more than 255 levels: a 500 per request)."""

from __future__ import annotations

import urllib.parse
from typing import Any

import orjson

from roomstream.events.canonical import MAX_NESTING_DEPTH
from tests.support.client import room_with
from tests.support.homeserver import Homeserver

DEPTHS = (MAX_NESTING_DEPTH + 1, 255, 256, 600, 1024, 1100)


def nested(levels: int) -> bytes:
    """A JSON object ``levels`` containers deep (the top-level object counts)."""
    return b'{"k":' + b"[" * (levels - 2) + b"{}" + b"]" * (levels - 2) + b"}"


def nested_in(key: str, levels: int) -> bytes:
    """``{key: <nested levels - 1>}``: the whole body ``levels`` deep."""
    return b'{"' + key.encode() + b'":' + nested(levels - 1) + b"}"


async def test_deep_bodies_are_refused_at_parse_time(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    room_id = await room_with(homeserver, alice, bob)
    endpoints: list[tuple[str, str, Any]] = [
        ("PUT", f"/user/{alice.user_id}/account_data/org.example.deep", nested),
        ("PUT", f"/user/{alice.user_id}/rooms/{room_id}/account_data/org.example.deep", nested),
        ("POST", f"/user/{alice.user_id}/filter", lambda d: nested_in("org.example.unknown", d)),
        (
            "PUT",
            "/sendToDevice/org.example.deep/{txn}",
            lambda d: (
                b'{"messages":{"' + bob.user_id.encode() + b'":{"*":' + nested(d - 3) + b"}}}"
            ),
        ),
        ("PUT", f"/rooms/{room_id}/send/org.example.deep/{{txn}}", nested),
        ("POST", "/createRoom", lambda d: nested_in("creation_content", d)),
    ]
    for method, path, body in endpoints:
        for depth in DEPTHS:
            raw = body(depth)
            assert raw.count(b"[") + raw.count(b"{") == depth
            status, answer = await homeserver.call(
                method, path.replace("{txn}", homeserver.txn()), raw=raw, token=alice.token
            )
            assert status == 400, (path, depth, status, answer)
            assert answer["errcode"] in ("M_BAD_JSON", "M_NOT_JSON"), (path, depth, answer)
    # Inline filters are JSON in the query string: the same bound.
    for depth in (MAX_NESTING_DEPTH + 1, 300):
        inline = urllib.parse.quote(nested_in("org.example.unknown", depth).decode())
        status, answer = await homeserver.call("GET", f"/sync?filter={inline}", token=alice.token)
        assert (status, answer["errcode"]) == (400, "M_BAD_JSON"), depth
    # Nothing was stored: both users sync fine, without the refused data.
    for user in (alice, bob):
        synced = await homeserver.ok("GET", "/sync", token=user.token)
        assert not any(e["type"] == "org.example.deep" for e in synced["account_data"]["events"])
        assert synced["to_device"]["events"] == []


async def test_nesting_up_to_the_bound_is_accepted(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    raw = nested(MAX_NESTING_DEPTH)
    path = f"/user/{alice.user_id}/account_data/org.example.deep"
    await homeserver.ok("PUT", path, raw=raw, token=alice.token)
    assert await homeserver.ok("GET", path, token=alice.token) == orjson.loads(raw)
    filter_body = nested_in("org.example.unknown", MAX_NESTING_DEPTH)
    await homeserver.ok("POST", f"/user/{alice.user_id}/filter", raw=filter_body, token=alice.token)
