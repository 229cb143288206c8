"""A homeserver in the test's event loop: the Client-Server API on an aiohttp test server,
over a fresh database on each engine."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from roomstream.storage import DatabaseConfig
from tests.support.cluster import USER_DATA_WRITERS, Cluster, run_cluster
from tests.support.fuzz import FuzzTarget, serve_fuzz_target
from tests.support.homeserver import (
    Homeserver,
    RunningServer,
    make_config,
    serve_homeserver,
    serve_roomstream,
)


@pytest.fixture
async def homeserver(db_config: DatabaseConfig, tmp_path: Path) -> AsyncIterator[Homeserver]:
    config = make_config(db_config, tmp_path)
    async with serve_homeserver(config) as server:
        yield server


# -- a real `roomstream run` process ------------------------------------------------------


@pytest.fixture
async def running_server(db_config: DatabaseConfig, tmp_path: Path) -> AsyncIterator[RunningServer]:
    """``roomstream run`` in a subprocess (see `serve_roomstream`)."""
    async with serve_roomstream(db_config, tmp_path) as server:
        yield server


# -- several `roomstream run` processes (PostgreSQL, Redis) -----------------------------


@pytest.fixture
async def cluster(tmp_path: Path, pg_database: str, redis_url: str) -> AsyncIterator[Cluster]:
    async with run_cluster(tmp_path, pg_database, {}) as running:
        yield running


@pytest.fixture
async def split_cluster(tmp_path: Path, pg_database: str, redis_url: str) -> AsyncIterator[Cluster]:
    async with run_cluster(tmp_path, pg_database, USER_DATA_WRITERS) as running:
        yield running


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzTarget]:
    """The fuzz tests' server (tests/support/fuzz.py), one per test module."""
    yield from serve_fuzz_target(tmp_path_factory)
