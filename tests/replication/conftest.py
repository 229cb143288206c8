"""The replication tests' fixtures (their helper classes: tests/support/replication.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from roomstream.storage import DatabaseConfig
from tests.support.replication import Cluster, ClusterFactory, make_config


@pytest.fixture
async def cluster_factory(
    db_config: DatabaseConfig, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[ClusterFactory]:
    clusters: list[Cluster] = []

    async def factory(transport: str, **kwargs: Any) -> Cluster:
        if transport == "redis":
            request.getfixturevalue("redis_url")  # fails under CI=true when Redis is down
        cluster = Cluster(make_config(db_config, tmp_path, transport, **kwargs), tmp_path)
        clusters.append(cluster)
        return cluster

    try:
        yield factory
    finally:
        for cluster in clusters:
            await cluster.close()
