"""A homeserver in the test's event loop: the Client-Server API on an aiohttp test server,
over a fresh database on each engine."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer

from roomstream.client import build_client_api
from roomstream.homeserver import open_room_engine
from roomstream.storage import DatabaseConfig
from roomstream.streams import InMemoryStream
from tests.support.cluster import USER_DATA_WRITERS, Cluster, run_cluster
from tests.support.homeserver import (
    SERVER_NAME,
    Homeserver,
    RunningServer,
    ServerProcess,
    make_config,
)
from tests.support.ports import free_port


@pytest.fixture
async def homeserver(db_config: DatabaseConfig, tmp_path: Path) -> AsyncIterator[Homeserver]:
    config = make_config(db_config, tmp_path)
    engine = await open_room_engine(config)
    app = web.Application(client_max_size=64 * 1024)
    process = build_client_api(config, engine, None, typing_stream=InMemoryStream("typing"))
    process.api.install(app)
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


# -- a real `roomstream run` process ------------------------------------------------------


@pytest.fixture
async def running_server(db_config: DatabaseConfig, tmp_path: Path) -> AsyncIterator[RunningServer]:
    """``roomstream run`` in a subprocess on free loopback ports, on the test's database;
    ready once it prints its ready line."""
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


# -- several `roomstream run` processes (PostgreSQL, Redis) -----------------------------


@pytest.fixture
async def cluster(tmp_path: Path, pg_database: str, redis_url: str) -> AsyncIterator[Cluster]:
    async with run_cluster(tmp_path, pg_database, {}) as running:
        yield running


@pytest.fixture
async def split_cluster(tmp_path: Path, pg_database: str, redis_url: str) -> AsyncIterator[Cluster]:
    async with run_cluster(tmp_path, pg_database, USER_DATA_WRITERS) as running:
        yield running
