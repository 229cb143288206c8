"""A push gateway of the tests' own (aiohttp on loopback) recording what it is sent, and
the body of a pusher pointing at it: shared by the pusher tests on one and many
processes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
from aiohttp import web
from aiohttp.test_utils import TestServer

NOTIFY = "/_matrix/push/v1/notify"


class Gateway:
    """A push gateway: records each notification it takes; answers 500 to the first
    ``failures`` requests (counting them in ``attempts``)."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.attempts = 0
        self.failures = 0
        #: Pushkeys answered as rejected.
        self.rejected: list[str] = []
        self.server: TestServer | None = None

    async def notify(self, request: web.Request) -> web.Response:
        self.attempts += 1
        if self.failures > 0:
            self.failures -= 1
            return web.json_response({"error": "down"}, status=500)
        self.received.append(orjson.loads(await request.read())["notification"])
        return web.json_response({"rejected": self.rejected})

    @property
    def url(self) -> str:
        assert self.server is not None
        return str(self.server.make_url(NOTIFY))

    def bodies(self) -> list[str]:
        return [n["content"]["body"] for n in self.received]


@asynccontextmanager
async def gateway() -> AsyncIterator[Gateway]:
    gw = Gateway()
    app = web.Application()
    app.router.add_post(NOTIFY, gw.notify)
    gw.server = TestServer(app, host="127.0.0.1")
    await gw.server.start_server()
    try:
        yield gw
    finally:
        await gw.server.close()


def pusher_body(url: str, pushkey: str = "key-1", **extra: Any) -> dict[str, Any]:
    return {
        "app_id": "io.example.app",
        "pushkey": pushkey,
        "kind": "http",
        "app_display_name": "Example",
        "device_display_name": "Phone",
        "lang": "en",
        "data": {"url": url, "extra": 1},
        **extra,
    }
