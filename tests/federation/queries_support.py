"""The federation query tests' server: the process's queries on a test server of their
own, authenticated by a stub that reads the origin from a test header."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from aiohttp.test_utils import TestServer

from roomstream.errors import MissingTokenError
from roomstream.federation.queries import FederationQueries
from roomstream.federation.query_routes import install_query_routes
from roomstream.httpbase import matrix_error_middleware
from roomstream.storage import DatabaseConfig
from tests.federation.edus_support import REMOTE, Scene, scene

ORIGIN_HEADER = "X-Test-Origin"
V1 = "/_matrix/federation/v1"


async def stub_authenticate(request: web.Request, content: bytes | None) -> str:
    origin = request.headers.get(ORIGIN_HEADER)
    if not origin:
        raise MissingTokenError("no X-Matrix authorization")
    return origin


@dataclass
class Fed:
    scene: Scene
    server: TestServer
    session: aiohttp.ClientSession

    async def raw(
        self, method: str, path: str, body: Any = None, *, origin: str | None = REMOTE
    ) -> tuple[int, str, bytes]:
        headers = {ORIGIN_HEADER: origin} if origin else {}
        data = None if body is None else orjson.dumps(body)
        url = self.server.make_url(V1 + path)
        async with self.session.request(method, url, data=data, headers=headers) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), await resp.read()

    async def call(self, method: str, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        status, content_type, content = await self.raw(method, path, body, **kw)
        assert content_type.startswith("application/json"), (status, content[:200])
        return status, orjson.loads(content)

    async def ok(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        status, answer = await self.call(method, path, body, **kw)
        assert status == 200, (path, status, answer)
        return answer


async def fed_server(db_config: DatabaseConfig, tmp_path: Path) -> AsyncIterator[Fed]:
    """The scene (tests/federation/edus_support.py) with its queries served."""
    async for one in scene(db_config, tmp_path):
        app = web.Application(middlewares=[matrix_error_middleware])
        queries = FederationQueries.for_client_process(one.hs.process, one.hs.engine)
        install_query_routes(app, queries, stub_authenticate)
        server = TestServer(app)
        await server.start_server()
        session = aiohttp.ClientSession()
        try:
            yield Fed(one, server, session)
        finally:
            await session.close()
            await server.close()


def errcode(answer: Any) -> str:
    return str(answer["errcode"])
