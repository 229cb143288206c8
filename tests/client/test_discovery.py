"""``GET /.well-known/matrix/client``: the configured public base URL, and CORS on every
answer under ``/.well-known`` (errors and 404s included), in process and on a real
``roomstream run`` listener; ``public_baseurl``'s validation."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from roomstream.client import build_client_api
from roomstream.config import ConfigError, InstanceConfig, parse_config
from roomstream.homeserver import open_room_engine
from roomstream.storage import DatabaseConfig
from tests.support.homeserver import Homeserver, RunningServer, make_config

ORIGIN = {"Origin": "https://app.example"}


async def get(
    session: aiohttp.ClientSession, url: str, method: str = "GET"
) -> tuple[int, object, dict[str, str]]:
    async with session.request(method, url, headers=ORIGIN) as resp:
        assert resp.content_type == "application/json", await resp.read()
        return resp.status, orjson.loads(await resp.read()), dict(resp.headers)


async def test_well_known_client_and_cors(homeserver: Homeserver) -> None:
    url = homeserver.server.make_url
    session = homeserver.session
    status, body, headers = await get(session, str(url("/.well-known/matrix/client")))
    # No public_baseurl and no listener configured: the default listener's URL.
    assert (status, body) == (200, {"m.homeserver": {"base_url": "http://127.0.0.1:8008/"}})
    assert headers["Access-Control-Allow-Origin"] == "*"
    # Every other answer under /.well-known carries CORS too (Chromium reads none without).
    for path, expected in [
        ("/.well-known/matrix/server", 404),
        ("/.well-known/matrix/support", 404),
        ("/.well-known/nothing", 404),
    ]:
        status, body, headers = await get(session, str(url(path)))
        assert (status, body["errcode"]) == (expected, "M_UNRECOGNIZED"), path  # type: ignore[index]
        assert headers["Access-Control-Allow-Origin"] == "*", path
    status, body, headers = await get(session, str(url("/.well-known/matrix/client")), "POST")
    assert (status, body["errcode"]) == (405, "M_UNRECOGNIZED")  # type: ignore[index]
    assert headers["Access-Control-Allow-Origin"] == "*"
    # A browser's preflight.
    status, body, headers = await get(session, str(url("/.well-known/matrix/client")), "OPTIONS")
    assert (status, body) == (200, {})
    assert "GET" in headers["Access-Control-Allow-Methods"]


@pytest.fixture
async def configured(db_config: DatabaseConfig, tmp_path: Path) -> AsyncIterator[TestServer]:
    config = make_config(
        db_config,
        tmp_path,
        public_baseurl="https://matrix.example.org/",
        instances={"main": InstanceConfig(http_port=8448)},
    )
    engine = await open_room_engine(config)
    app = web.Application()
    process = build_client_api(config, engine, None)
    process.api.install(app)
    server = TestServer(app)
    await server.start_server()
    try:
        yield server
    finally:
        await server.close()
        process.close()
        await engine.close()


async def test_well_known_client_says_the_configured_url(configured: TestServer) -> None:
    async with aiohttp.ClientSession() as session:
        status, body, _ = await get(session, str(configured.make_url("/.well-known/matrix/client")))
    assert (status, body) == (200, {"m.homeserver": {"base_url": "https://matrix.example.org/"}})


async def test_well_known_on_a_real_listener(running_server: RunningServer) -> None:
    async with aiohttp.ClientSession() as session:
        status, body, headers = await get(
            session, running_server.url + "/.well-known/matrix/client"
        )
        assert (status, body) == (200, {"m.homeserver": {"base_url": running_server.url + "/"}})
        assert headers["Access-Control-Allow-Origin"] == "*"
        # The URL it gives is the client API's: a client following it finds /versions.
        async with session.get(running_server.url + "/_matrix/client/versions") as resp:
            assert resp.status == 200 and "versions" in await resp.json()
        status, body, headers = await get(session, running_server.url + "/.well-known/matrix/x")
        assert (status, body["errcode"]) == (404, "M_UNRECOGNIZED")  # type: ignore[index]
        assert headers["Access-Control-Allow-Origin"] == "*"
        # Outside /_matrix and /.well-known: no CORS (nothing a browser client calls).
        status, body, headers = await get(session, running_server.url + "/elsewhere")
        assert status == 404 and "Access-Control-Allow-Origin" not in headers


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("https://matrix.example.org", "https://matrix.example.org/"),
        ("http://127.0.0.1:8008/", "http://127.0.0.1:8008/"),
        ("https://example.org/matrix", "https://example.org/matrix/"),
        ("http://[::1]:8008", "http://[::1]:8008/"),
    ],
)
def test_public_baseurl_is_kept_with_a_trailing_slash(value: str, expected: str) -> None:
    assert parse_config({"public_baseurl": value}).client_base_url() == expected


@pytest.mark.parametrize(
    "value",
    [
        "matrix.example.org",
        "ftp://example.org/",
        "https://",
        "https://example.org/?x=1",
        "https://example.org/#top",
        "https://user@example.org/",
        "https://example.org:99999/",
        "https://example.org:port/",
        "https://exa mple.org/",
        "",
        5,
        ["https://example.org/"],
    ],
)
def test_public_baseurl_mistakes_are_one_line(value: object) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"public_baseurl": value})
    assert len(caught.value.problems) == 1
    assert caught.value.problems[0].startswith("public_baseurl must be an http:// or https:// URL")


def test_allow_guest_access_must_be_a_boolean() -> None:
    assert parse_config({}).allow_guest_access is False
    assert parse_config({"allow_guest_access": True}).allow_guest_access is True
    with pytest.raises(ConfigError) as caught:
        parse_config({"allow_guest_access": "yes"})
    assert caught.value.problems == ["allow_guest_access must be true or false, not 'yes'"]


def test_default_base_url_follows_the_listener() -> None:
    config = parse_config(
        {
            "instances": {"main": {"http_port": 8123, "host": "0.0.0.0"}},
            "replication": {"shared_secret": "s"},
        }
    )
    # A wildcard bind is reached on loopback from this machine.
    assert config.client_base_url() == "http://127.0.0.1:8123/"
