"""Malformed federation queries: every one is answered 4xx with a Matrix error (JSON with
an ``errcode``), never a 500 (SQLite: the checks are before storage)."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson
import pytest

from roomstream.storage import DatabaseConfig
from tests.federation.queries_support import Fed, fed_server

# Long enough to pass any identifier bound, short enough for aiohttp's 8 KiB request line
# (longer lines are refused by the parser, which the real listener answers as JSON).
NASTY_STRINGS = [
    "",
    "x",
    "@",
    "@:",
    "#",
    "#:",
    "!",
    "@a:b:c:d",
    "\u0000",
    "\udcff".encode("utf-8", "surrogatepass").decode("utf-8", "replace"),
    "%",
    "é" * 300,
    "@" + "a" * 3000 + ":test.local",
    "#" + "a" * 3000 + ":test.local",
    "../../etc/passwd",
]
NASTY_BODIES: list[Any] = [
    None,
    [],
    "string",
    1,
    {"device_keys": None},
    {"device_keys": []},
    {"device_keys": {"@alice:test.local": "all"}},
    {"device_keys": {"@alice:test.local": [1, 2]}},
    {"device_keys": {"not a user": []}},
    {"one_time_keys": {"@alice:test.local": []}},
    {"one_time_keys": {"@alice:test.local": {"D": 5}}},
    {"one_time_keys": {"nope": {"D": "x"}}},
    {"limit": "ten"},
    b'{"limit": 1208925819614629174706176}',
    b'{"limit": 1e400}',
    b"[" * 300 + b"]" * 300,
    {"since": 5},
    {"since": "x" * 2000},
    {"filter": []},
    {"filter": {"generic_search_term": 7}},
    {"include_all_networks": "yes"},
]


@pytest.fixture(params=["sqlite"])
def engine_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def fed(db_config: DatabaseConfig, tmp_path: Path) -> AsyncIterator[Fed]:
    async for one in fed_server(db_config, tmp_path):
        yield one


async def check(fed: Fed, method: str, path: str, body: Any = None) -> None:
    """``body``: JSON to send, bytes sent as they are, None with POST: not JSON."""
    if method == "GET":
        status, content_type, content = await fed.raw(method, path, None)
    else:
        if isinstance(body, bytes):
            data = body
        else:
            data = b"{not json" if body is None else orjson.dumps(body)
        url = fed.server.make_url("/_matrix/federation/v1" + path)
        headers = {"X-Test-Origin": "remote.test"}
        async with fed.session.request(method, url, data=data, headers=headers) as resp:
            status = resp.status
            content_type = resp.headers.get("Content-Type", "")
            content = await resp.read()
    assert status < 500, (method, path, body, status, content[:300])
    if status >= 400:
        assert content_type.startswith("application/json"), (path, status)
        assert isinstance(orjson.loads(content).get("errcode"), str), (path, content[:200])


async def test_malformed_queries_are_refused_not_failed(fed: Fed) -> None:
    for value in NASTY_STRINGS:
        q = quote(value, safe="")
        for path in (
            f"/query/profile?user_id={q}",
            f"/query/profile?user_id={quote('@alice:test.local')}&field={q}",
            f"/query/directory?room_alias={q}",
            f"/publicRooms?since={q}",
            f"/publicRooms?limit={q}",
            f"/user/devices/{q or 'x'}",
            f"/hierarchy/{q or 'x'}",
            f"/hierarchy/{quote(fed.scene.room_id)}?suggested_only={q}",
            f"/media/download/{q or 'x'}",
            f"/media/download/abc?timeout_ms={q}",
            f"/media/thumbnail/{q or 'x'}?width=10&height=10",
            f"/media/thumbnail/abc?width={q}&height=10&method={q}",
        ):
            await check(fed, "GET", path)
    for path, body in itertools.product(
        ["/publicRooms", "/user/keys/query", "/user/keys/claim"], NASTY_BODIES
    ):
        await check(fed, "POST", path, body)
    # A body that is not JSON at all.
    for path in ("/publicRooms", "/user/keys/query", "/user/keys/claim"):
        await check(fed, "POST", path)
