"""A process does not trust its token cache while the ``caches`` stream is not live.

Each process caches token owners; a logout on the ``caches`` writer reaches the others'
caches as a replication row. While a reader's link to that writer is down (Redis
unreachable, the TCP connection lost, or not yet caught up) that row cannot arrive, so
the reader reads tokens from the database: a token logged out meanwhile is refused at
once, not after the outage (it was accepted for 8 s). ``/health`` (the node's
``status()``) says ``degraded`` the moment the link is lost, not after redis-py's retries
(3.5-5 s before).

The link is cut by a TCP proxy in front of Redis (or of the writer's replication port)
that only the reader goes through, so the real Redis is never stopped. Nodes run in
process (:class:`~roomstream.homeserver.Homeserver`, each with its own
database pool, follower, transport and client API on an HTTP port), on both engines.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from roomstream.accounts import Accounts
from roomstream.accounts.token_cache import TokenCache
from roomstream.accounts.tokens import token_hash
from roomstream.config import Config
from roomstream.homeserver import Homeserver, open_room_engine
from roomstream.replication.worker import ReplicationNode
from roomstream.storage import DatabaseConfig
from tests.support.ports import free_port
from tests.support.replication import TRANSPORTS, make_config
from tests.support.wait import wait_for

#: How soon /health must say degraded after the link is cut (the detection is event
#: driven; this only bounds a loaded machine's scheduling).
DETECTION_DEADLINE = 1.0


class CuttableProxy:
    """Forwards TCP connections to ``target``; ``cut()`` drops them all and refuses new
    ones (accepted and closed at once, as a host whose server is gone), ``restore()``
    forwards again."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = free_port()
        self.is_cut = False
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.is_cut:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.transport.abort()
            self._writers.discard(writer)

    def cut(self) -> None:
        self.is_cut = True
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    def restore(self) -> None:
        self.is_cut = False

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


@contextlib.asynccontextmanager
async def writer_and_cut_off_reader(
    db_config: DatabaseConfig, tmp_path: Path, transport: str
) -> AsyncIterator[tuple[Homeserver, Homeserver, CuttableProxy]]:
    """``w1`` writes ``caches`` (and events); ``reader`` reaches it (Redis, or w1's
    replication port) only through a :class:`CuttableProxy`."""
    instances: dict[str, dict[str, Any]] = {
        name: {
            "replication_port": free_port(),
            "http_port": free_port(),
            # The caches writer's internal API takes forwarded logouts: with it, the
            # processes cache tokens (docs/client_api.md).
            "internal_port": free_port(),
        }
        for name in ("w1", "reader")
    }
    config = make_config(
        db_config,
        tmp_path,
        transport,
        # device_lists: every logout writes a row there (no instance is called main).
        stream_writers={"caches": ["w1"], "events": ["w1"], "device_lists": ["w1"]},
        instances=instances,
    )
    if transport == "redis":
        proxy = CuttableProxy(config.redis.host, config.redis.port)
        reader_config: Config = dataclasses.replace(
            config, redis=dataclasses.replace(config.redis, port=proxy.port)
        )
    else:
        w1 = config.instances["w1"]
        assert w1.replication_port is not None
        proxy = CuttableProxy(w1.host, w1.replication_port)
        reader_config = dataclasses.replace(
            config,
            instances={
                **config.instances,
                "w1": dataclasses.replace(w1, replication_port=proxy.port),
            },
        )
    await proxy.start()
    servers: list[Homeserver] = []
    try:
        for node_config in (config.with_instance("w1"), reader_config.with_instance("reader")):
            engine = await open_room_engine(node_config)
            server = Homeserver(node_config, engine)
            servers.append(server)
            await server.start()
        yield servers[0], servers[1], proxy
    finally:
        for server in reversed(servers):
            await server.stop()
            await server.engine.close()
        await proxy.close()


class Api:
    def __init__(self, session: aiohttp.ClientSession, server: Homeserver) -> None:
        assert server.client_http is not None
        self.session = session
        self.base = f"http://127.0.0.1:{server.client_http.port}/_matrix/client/v3"

    async def call(
        self, method: str, path: str, body: Any = None, token: str | None = None
    ) -> tuple[int, Any]:
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        async with self.session.request(
            method, self.base + path, json=body, headers=headers
        ) as resp:
            return resp.status, await resp.json()

    async def ok(self, method: str, path: str, body: Any = None, token: str | None = None) -> Any:
        status, answer = await self.call(method, path, body, token)
        assert status == 200, (method, path, status, answer)
        return answer


async def until_degraded(node: ReplicationNode) -> float:
    """Seconds until the node's health (what ``/health`` serves) says degraded; fails
    past ``DETECTION_DEADLINE``."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while node.status()["status"] != "degraded":
        elapsed = loop.time() - start
        assert elapsed < DETECTION_DEADLINE, f"still ok {elapsed:.2f}s after the cut"
        await asyncio.sleep(0.005)
    return loop.time() - start


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_token_logged_out_during_an_outage_is_refused_at_once(
    db_config: DatabaseConfig, tmp_path: Path, transport: str, request: pytest.FixtureRequest
) -> None:
    if transport == "redis":
        request.getfixturevalue("redis_url")  # fails under CI=true when Redis is down
    async with (
        writer_and_cut_off_reader(db_config, tmp_path, transport) as (writer, reader_server, proxy),
        aiohttp.ClientSession() as session,
    ):
        on_writer, on_reader = Api(session, writer), Api(session, reader_server)
        reader = reader_server.replication
        await wait_for(lambda: reader.stream_live("caches"), what="the reader's caches link")
        client = reader_server.client
        assert client is not None and client.token_cache is not None
        cache = client.token_cache
        body = {"username": "carol", "password": "pw-carol", "auth": {"type": "m.login.dummy"}}
        token = (await on_writer.ok("POST", "/register", body))["access_token"]
        await on_reader.ok("GET", "/account/whoami", token=token)
        assert cache.get(token_hash(token)) is not None  # cached on the reader

        proxy.cut()
        await until_degraded(reader)
        assert not reader.stream_live("caches")
        await on_writer.ok("POST", "/logout", {}, token=token)
        # The invalidation cannot reach the reader; it reads the database instead.
        status, answer = await on_reader.call("GET", "/account/whoami", token=token)
        assert (status, answer.get("errcode")) == (401, "M_UNKNOWN_TOKEN")
        assert cache.get(token_hash(token)) is not None  # still there, not trusted
        # A live token still works meanwhile (from the database, not cached).
        login = {"type": "m.login.password", "user": "carol", "password": "pw-carol"}
        fresh = (await on_writer.ok("POST", "/login", login))["access_token"]
        await on_reader.ok("GET", "/account/whoami", token=fresh)
        assert cache.get(token_hash(fresh)) is None

        proxy.restore()
        await wait_for(lambda: reader.stream_live("caches"), what="live again")
        assert reader.status()["status"] == "ok"
        # Catching up applied the logout's row: the stale entry is gone.
        assert cache.get(token_hash(token)) is None
        status, answer = await on_reader.call("GET", "/account/whoami", token=token)
        assert (status, answer.get("errcode")) == (401, "M_UNKNOWN_TOKEN")
        await on_reader.ok("GET", "/account/whoami", token=fresh)
        assert cache.get(token_hash(fresh)) is not None  # trusted (and filled) again


# -- the token cache's side, without replication ------------------------------------------


class CountingStore:
    """The part of ``AccountStore`` authentication uses, counting database reads."""

    def __init__(self, owners: dict[str, tuple[str, str]]) -> None:
        self.owners = owners
        self.reads = 0

    async def get_token_owner(self, hashed: str) -> tuple[str, str] | None:
        self.reads += 1
        return self.owners.get(hashed)


async def test_untrusted_cache_is_neither_read_nor_filled() -> None:
    live = [True]
    cache = TokenCache(live=lambda: live[0])
    store = CountingStore({token_hash("t"): ("@a:hs", "D")})
    accounts = Accounts(
        store,  # type: ignore[arg-type]
        "hs",
        token_cache=cache,
        forward_end_sessions=lambda user, device: asyncio.sleep(0),
    )
    await accounts.authenticate("t")
    await accounts.authenticate("t")
    assert (store.reads, len(cache)) == (1, 1)  # live: read once, then cached
    live[0] = False
    del store.owners[token_hash("t")]  # logged out elsewhere; the row did not arrive
    with pytest.raises(Exception, match="unknown or expired"):
        await accounts.authenticate("t")
    store.owners[token_hash("u")] = ("@b:hs", "E")
    await accounts.authenticate("u")
    await accounts.authenticate("u")
    assert store.reads == 4 and cache.get(token_hash("u")) is None
