"""The client API fuzz tests' server: a homeserver on its own thread and event loop, and
the JSON values they draw."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from hypothesis import strategies as st

from roomstream.client import build_client_api
from roomstream.client.server import CLIENT_PREFIX
from roomstream.homeserver import open_room_engine
from roomstream.rooms.engine import RoomEngine
from roomstream.storage import DatabaseConfig
from roomstream.streams import InMemoryStream
from tests.support.homeserver import make_config


@dataclass
class FuzzTarget:
    port: int
    token: str
    user_id: str
    room_id: str
    event_id: str
    routes: list[tuple[str, str]]


def serve_fuzz_target(
    tmp_path_factory: pytest.TempPathFactory, **overrides: Any
) -> Iterator[FuzzTarget]:
    """A client API on its own thread and event loop (hypothesis drives it with plain
    blocking requests), with a user, a room and an event; stopped when resumed.
    ``overrides``: configuration keys (``Config`` fields) other than the defaults."""
    tmp: Path = tmp_path_factory.mktemp("fuzz")
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    found: dict[str, Any] = {}

    async def start() -> tuple[RoomEngine, web.AppRunner, Any]:
        config = make_config(
            DatabaseConfig(engine="sqlite", path=str(tmp / "fuzz.db")), tmp, **overrides
        )
        engine = await open_room_engine(config)
        process = build_client_api(config, engine, None, typing_stream=InMemoryStream("typing"))
        app = web.Application(client_max_size=64 * 1024)
        process.api.install(app)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        user = await process.accounts.create_account("fuzzer", "pw", inhibit_login=False)
        from roomstream.accounts import Requester

        requester = Requester(user.user_id, str(user.device_id))
        room_id = await process.rooms.create_room(requester, _create_request())
        event_id = await process.rooms.send_event(
            requester, room_id, "m.room.message", {"body": "x"}, "t0"
        )
        server = site._server
        assert server is not None
        found.update(
            port=server.sockets[0].getsockname()[1],  # type: ignore[union-attr]
            token=user.access_token,
            user_id=user.user_id,
            room_id=room_id,
            event_id=event_id,
            routes=[
                (r.method, r.path if r.absolute else CLIENT_PREFIX + "/v3" + r.path)
                for r in process.api.routes
            ],
        )
        return engine, runner, process

    def run() -> None:
        asyncio.set_event_loop(loop)
        started = loop.run_until_complete(start())
        found["started"] = started
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(60)
    yield FuzzTarget(
        found["port"],
        found["token"],
        found["user_id"],
        found["room_id"],
        found["event_id"],
        found["routes"],
    )

    async def stop() -> None:
        engine, runner, process = found["started"]
        await runner.cleanup()
        process.close()
        await engine.close()

    asyncio.run_coroutine_threadsafe(stop(), loop).result(60)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(30)


def _create_request() -> Any:
    from roomstream.client.rooms import CreateRoomRequest

    return CreateRoomRequest(preset="public_chat")


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**60), 2**60)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)
