"""A homeserver in the test's event loop (:class:`Homeserver`, the client tests'
``homeserver`` fixture) and real ``roomstream`` processes (:class:`ServerProcess`,
:class:`RunningServer`): the helper classes of tests/client/conftest.py's fixtures."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer

from roomstream.client import ClientProcess, build_client_api
from roomstream.client.remote_history import RemoteHistory
from roomstream.config import Config
from roomstream.homeserver import open_room_engine
from roomstream.rooms.engine import RoomEngine
from roomstream.storage import DatabaseConfig
from roomstream.streams import InMemoryStream
from tests.support.ports import free_port

SERVER_NAME = "test.local"


@dataclass
class User:
    user_id: str
    token: str
    device_id: str


@dataclass
class Homeserver:
    server: TestServer
    session: aiohttp.ClientSession
    engine: RoomEngine
    config: Config
    process: ClientProcess
    counter: list[int] = field(default_factory=lambda: [0])

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        token: str | None = None,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        """(status, decoded JSON body); the path may omit /_matrix/client/v3."""
        if not path.startswith("/_matrix"):
            path = "/_matrix/client/v3" + path
        all_headers = dict(headers or {})
        if token is not None:
            all_headers["Authorization"] = f"Bearer {token}"
        data = raw if raw is not None else (None if body is None else orjson.dumps(body))
        url = self.server.make_url(path)
        async with self.session.request(method, url, data=data, headers=all_headers) as resp:
            content = await resp.read()
            assert resp.content_type == "application/json", (resp.status, content[:200])
            return resp.status, orjson.loads(content)

    async def ok(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        status, result = await self.call(method, path, body, **kw)
        assert status == 200, (method, path, status, result)
        return result

    async def register(self, name: str, password: str = "secret-password") -> User:
        body = {"username": name, "password": password, "auth": {"type": "m.login.dummy"}}
        result = await self.ok("POST", "/register", body)
        return User(result["user_id"], result["access_token"], result["device_id"])

    def txn(self) -> str:
        self.counter[0] += 1
        return f"t{self.counter[0]}"


def signal_waits(hs: Homeserver) -> asyncio.Event:
    """An event set when a long poll has read, found nothing, and starts waiting on the
    notifier (so that what happens next can only reach it by a wake)."""
    notifier = hs.process.notifier
    original_listen = notifier.listen
    waiting = asyncio.Event()

    @contextmanager
    def listen(user_id: str, room_ids: Any) -> Iterator[Any]:
        with original_listen(user_id, room_ids) as waiter:
            original_wait = waiter.wait

            async def wait(seconds: float) -> bool:
                waiting.set()
                return await original_wait(seconds)

            waiter.wait = wait  # type: ignore[method-assign]
            yield waiter

    notifier.listen = listen  # type: ignore[method-assign]
    return waiting


@asynccontextmanager
async def serve_homeserver(
    config: Config,
    *,
    prepare: Callable[[ClientProcess], Awaitable[None]] | None = None,
    remote_history: RemoteHistory | None = None,
) -> AsyncIterator[Homeserver]:
    """The Client-Server API of ``config`` in this process (the ``homeserver`` fixture's
    server), on a test server; ``prepare`` runs once the API is installed, before it
    serves (starting background work: presence timers, pushers); ``remote_history``: what
    backwards `/messages` pages past the stored start of a room ask (backfill)."""
    engine = await open_room_engine(config)
    app = web.Application(client_max_size=64 * 1024)
    process = build_client_api(
        config,
        engine,
        None,
        typing_stream=InMemoryStream("typing"),
        remote_history=remote_history,
    )
    process.api.install(app)
    if prepare is not None:
        await prepare(process)
    server = TestServer(app)
    await server.start_server()
    session = aiohttp.ClientSession()
    try:
        yield Homeserver(server, session, engine, config, process)
    finally:
        await session.close()
        await server.close()
        process.close()
        await engine.close()


def make_config(db_config: DatabaseConfig, tmp_path: Path, **overrides: Any) -> Config:
    return Config(server_name=SERVER_NAME, data_dir=str(tmp_path), database=db_config, **overrides)


@dataclass
class RunningServer:
    url: str
    server_name: str
    process: asyncio.subprocess.Process


class ServerProcess:
    """One roomstream process (``roomstream run`` or the worker module) with its output."""

    def __init__(self, *args: str) -> None:
        self.args = args
        self.process: asyncio.subprocess.Process | None = None
        self.output: list[str] = []
        self._drainer: asyncio.Task[None] | None = None

    async def start(self, limit: float = 60) -> None:
        """Start and return once it prints its ready line."""
        self.process = process = await asyncio.create_subprocess_exec(
            sys.executable,
            *self.args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        assert process.stdout is not None
        ready = asyncio.Event()

        async def drain() -> None:
            assert process.stdout is not None
            while line := await process.stdout.readline():
                self.output.append(line.decode(errors="replace"))
                if " ready " in self.output[-1]:
                    ready.set()

        self._drainer = asyncio.create_task(drain())
        waiter = asyncio.create_task(ready.wait())
        await asyncio.wait({waiter, self._drainer}, timeout=limit, return_when="FIRST_COMPLETED")
        if not ready.is_set():
            waiter.cancel()
            await self.stop()
            raise AssertionError("roomstream did not get ready:\n" + "".join(self.output))

    async def stop(self) -> None:
        process = self.process
        if process is not None and process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 30)
            except TimeoutError:
                process.kill()
                await process.wait()
        if self._drainer is not None:
            await self._drainer

    async def kill(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            await self.process.wait()
        if self._drainer is not None:
            await self._drainer

    def errors(self) -> list[str]:
        return [line for line in self.output if "Traceback" in line or " ERROR " in line]


@asynccontextmanager
async def serve_roomstream(
    db_config: DatabaseConfig, tmp_path: Path, extra: dict[str, Any] | None = None
) -> AsyncIterator[RunningServer]:
    """``roomstream run`` in a subprocess on free loopback ports, on the given database
    (``extra``: more top-level configuration keys); entered once it prints its ready
    line, stopped (and checked for errors) on exit."""
    database: dict[str, Any] = {"engine": db_config.engine}
    if db_config.engine == "sqlite":
        database["path"] = str(tmp_path / "server.db")
    else:
        database.update(dsn=db_config.dsn, schema=db_config.schema)
    http_port = free_port()
    config = {
        "server_name": SERVER_NAME,
        "data_dir": str(tmp_path / "data"),
        "database": database,
        "instances": {
            "main": {
                "http_port": http_port,
                "internal_port": free_port(),
                "replication_port": free_port(),
            }
        },
    }
    config.update(extra or {})
    config_path = tmp_path / "roomstream.yaml"
    config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
    server = ServerProcess("-m", "roomstream.cli", "-c", str(config_path), "run")
    await server.start()
    try:
        assert server.process is not None
        yield RunningServer(f"http://127.0.0.1:{http_port}", SERVER_NAME, server.process)
    finally:
        await server.stop()
    assert not server.errors(), "".join(server.output[-80:])
