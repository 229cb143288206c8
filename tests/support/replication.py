"""The configuration of in-process replication nodes on the test's database, over each
transport."""

from __future__ import annotations

import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

from roomstream.config import Config, parse_config
from roomstream.storage import DatabaseConfig

TRANSPORTS = ("tcp", "redis")


def make_config(
    db_config: DatabaseConfig,
    tmp_path: Path,
    transport: str,
    *,
    stream_writers: dict[str, list[str]],
    instances: dict[str, dict[str, Any]],
    replication: dict[str, Any] | None = None,
) -> Config:
    database = {k: v for k, v in asdict(db_config).items() if k != "options"}
    return parse_config(
        {
            "server_name": f"hs-{uuid.uuid4().hex[:10]}.test",  # one Redis channel per test
            "data_dir": str(tmp_path / "data"),
            "database": database,
            "stream_writers": stream_writers,
            "instances": instances,
            "replication": {"transport": transport, **(replication or {})},
        }
    )
