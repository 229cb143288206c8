"""Fixtures of the federation tests that run real servers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from roomstream.federation.certs import TestCertificateAuthority
from roomstream.storage import DatabaseConfig
from tests.support.federation_servers import FederatedServer


@pytest.fixture
async def servers(
    db_config: DatabaseConfig, tmp_path: Path
) -> AsyncIterator[tuple[FederatedServer, FederatedServer]]:
    """Two ``roomstream run`` processes federating on loopback: A on SQLite, B on the
    parametrised engine, trusting one test CA."""
    ca = TestCertificateAuthority()
    a = FederatedServer(
        tmp_path, "a", DatabaseConfig(engine="sqlite", path=str(tmp_path / "a.db")), ca
    )
    b = FederatedServer(tmp_path, "b", db_config, ca)
    try:
        await a.start()
        await b.start()
        yield a, b
    finally:
        await b.close()
        await a.close()
