"""Several ``roomstream run`` processes on one PostgreSQL schema with Redis replication
(``w1``, ``w2``: events writers; ``reader``), and a plain-HTTP client of one of them:
the helpers of the ``cluster``/``split_cluster`` fixtures (tests/client/conftest.py)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psycopg
import yaml
from psycopg import sql

from tests.support.homeserver import ServerProcess
from tests.support.ports import free_port

Cluster = tuple[dict[str, ServerProcess], dict[str, Any]]


@contextlib.asynccontextmanager
async def run_cluster(
    tmp_path: Path,
    pg_database: str,
    stream_writers: dict[str, list[str]],
    extra: dict[str, Any] | None = None,
) -> AsyncIterator[Cluster]:
    """``w1``, ``w2`` (the events writers) and ``reader``, as processes (``extra``: more
    top-level configuration keys)."""
    schema = f"client_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    raw = {
        "server_name": f"c{uuid.uuid4().hex[:8]}.test",
        "data_dir": str(tmp_path / "data"),
        "database": {"engine": "postgres", "dsn": pg_database, "schema": schema},
        # No instance is called main (the default writer of unnamed streams): every stream
        # a test writes is named here; device_lists because every logout writes to it,
        # presence because every sync does.
        "stream_writers": {
            "events": ["w1", "w2"],
            "device_lists": ["w1"],
            "presence": ["w1"],
            **stream_writers,
        },
        "instances": {
            "w1": {
                "replication_port": free_port(),
                "http_port": free_port(),
                "internal_port": free_port(),
            },
            "w2": {
                "replication_port": free_port(),
                "http_port": free_port(),
                "internal_port": free_port(),
            },
            "reader": {"http_port": free_port(), "internal_port": free_port()},
        },
        "replication": {"transport": "redis"},
        **(extra or {}),
    }
    config_path = tmp_path / "roomstream.yaml"
    config_path.write_text(yaml.safe_dump(raw))
    processes = {
        name: ServerProcess(
            "-m", "roomstream.cli", "-c", str(config_path), "run", "--instance", name
        )
        for name in ("w1", "w2", "reader")
    }
    try:
        for process in processes.values():
            await process.start()
        yield processes, raw
    finally:
        for process in processes.values():
            await process.stop()
    for name, process in processes.items():
        assert not process.errors(), name + ":\n" + "".join(process.output[-60:])


#: The per-user streams' writers: none of them is the reader.
USER_DATA_WRITERS = {
    "account_data": ["w1"],
    "to_device": ["w1"],
    "receipts": ["w2"],
    "typing": ["w2"],
}


class Client:
    """One user's access token on one process, over plain HTTP."""

    def __init__(self, session: aiohttp.ClientSession, url: str, user_id: str, token: str):
        self.session, self.url, self.user_id, self.token = session, url, user_id, token
        self.since: str | None = None

    def on(self, url: str) -> Client:
        """The same user (same token) talking to another process."""
        return Client(self.session, url, self.user_id, self.token)

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        async with self.session.request(
            method,
            self.url + "/_matrix/client/v3" + path,
            data=None if body is None else orjson.dumps(body),
            headers={"Authorization": f"Bearer {self.token}"},
        ) as resp:
            assert resp.content_type == "application/json", (resp.status, await resp.read())
            return resp.status, orjson.loads(await resp.read())

    async def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, result = await self.call(method, path, body)
        assert status == 200, (method, path, status, result)
        return result

    async def sync_until(self, found: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """Long-poll /sync until an answer satisfies ``found``; that answer."""

        async def poll() -> dict[str, Any]:
            while True:
                query = "?timeout=10000" + (f"&since={self.since}" if self.since else "")
                response: dict[str, Any] = await self.ok("GET", "/sync" + query)
                self.since = response["next_batch"]
                if found(response):
                    return response

        return await asyncio.wait_for(poll(), 60)


async def register(session: aiohttp.ClientSession, url: str, name: str) -> Client:
    body = {"username": name, "password": f"pw-{name}", "auth": {"type": "m.login.dummy"}}
    async with session.post(url + "/_matrix/client/v3/register", data=orjson.dumps(body)) as r:
        assert r.status == 200, await r.read()
        result = orjson.loads(await r.read())
    client = Client(session, url, result["user_id"], result["access_token"])
    return client


def joined(response: dict[str, Any], room_id: str) -> dict[str, Any]:
    return response["rooms"]["join"].get(room_id) or {
        "timeline": {"events": []},
        "ephemeral": {"events": []},
        "account_data": {"events": []},
    }


def urls(raw: dict[str, Any]) -> dict[str, str]:
    return {n: f"http://127.0.0.1:{i['http_port']}" for n, i in raw["instances"].items()}
