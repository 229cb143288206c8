"""Every JSON answer says ``Content-Type: application/json``, exactly, as Synapse does
(some clients compare the header): successes, Matrix errors, aiohttp's own refusals,
CORS preflights, and the internal API's answers. aiohttp's ``json_response`` said
``application/json; charset=utf-8``."""

from __future__ import annotations

from pathlib import Path

import aiohttp
from aiohttp.test_utils import TestServer

from roomstream.config import Config
from roomstream.replication.http import PREFIX, InternalHttpServer
from roomstream.replication.secret import effective_shared_secret
from roomstream.storage import DatabaseConfig
from tests.support.homeserver import Homeserver, make_config


async def _content_type(
    session: aiohttp.ClientSession, method: str, url: str, **kwargs: object
) -> tuple[int, str]:
    async with session.request(method, url, **kwargs) as resp:  # type: ignore[arg-type]
        await resp.read()
        return resp.status, resp.headers.get("Content-Type", "")


async def test_client_api_answers_say_exactly_application_json(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    auth = {"Authorization": f"Bearer {alice.token}"}
    url = homeserver.server.make_url
    v3 = "/_matrix/client/v3"
    cases = [
        ("GET", "/_matrix/client/versions", {}, 200),
        ("GET", v3 + "/account/whoami", {"headers": auth}, 200),
        ("GET", v3 + "/pushrules/", {"headers": auth}, 200),
        ("GET", v3 + "/account/whoami", {}, 401),  # M_MISSING_TOKEN
        ("POST", v3 + "/register", {"data": b"{}"}, 401),  # user-interactive auth
        ("POST", v3 + "/createRoom", {"headers": auth, "data": b"{not json"}, 400),
        ("GET", v3 + "/no/such/endpoint", {}, 404),  # aiohttp's routing, mapped
        ("DELETE", "/_matrix/client/versions", {}, 405),
        (
            "OPTIONS",
            v3 + "/sync",
            {"headers": {"Origin": "https://app.example", "Access-Control-Request-Method": "GET"}},
            200,
        ),
    ]
    for method, path, kwargs, expected_status in cases:
        status, content_type = await _content_type(
            homeserver.session, method, str(url(path)), **kwargs
        )
        assert status == expected_status, (method, path, status)
        assert content_type == "application/json", (method, path, content_type)


async def test_internal_api_answers_say_exactly_application_json(
    db_config: DatabaseConfig, tmp_path: Path
) -> None:
    config: Config = make_config(db_config, tmp_path)
    internal = InternalHttpServer(config, status=lambda: {"problems": []})
    secret = {"Authorization": f"Bearer {effective_shared_secret(config)}"}
    server = TestServer(internal.app)
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            for path, headers, expected_status in [
                (PREFIX + "/health", secret, 200),  # json_response in the handler
                (PREFIX + "/health", {}, 401),  # refused by the bearer middleware
                (PREFIX + "/streams/nonsense/updates", secret, 404),  # a MatrixError
                (PREFIX + "/streams/typing/updates?from=x", secret, 404),
                ("/nowhere", secret, 404),
            ]:
                status, content_type = await _content_type(
                    session, "GET", str(server.make_url(path)), headers=headers
                )
                assert status == expected_status, (path, status)
                assert content_type == "application/json", (path, content_type)
    finally:
        await server.close()
