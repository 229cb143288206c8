"""Several real roomstream processes starting at once on a fresh database.

The README's multi-process example starts every instance together; each one migrates the
schema as it comes up. These tests start N real ``roomstream`` processes together on a
new database (a new file on SQLite, a new schema on PostgreSQL) and require every one of
them to succeed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from roomstream.storage import DatabaseConfig
from tests.support.ports import free_port

PROCESSES = 6
ROUNDS = 3


def _database_section(db_config: DatabaseConfig) -> dict[str, Any]:
    if db_config.engine == "sqlite":
        return {"engine": "sqlite", "path": db_config.path}
    return {"engine": "postgres", "dsn": db_config.dsn, "schema": db_config.schema, "pool_min": 1}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "ROOMSTREAM_CONFIG"}
    env["COLUMNS"] = "200"
    return env


def _start(args: list[str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "roomstream.cli", *args],
        cwd=cwd,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _fresh(db_config: DatabaseConfig, round_no: int) -> DatabaseConfig:
    """Another new, empty database like ``db_config`` (a new file or a new schema)."""
    if round_no == 0:
        return db_config
    if db_config.engine == "sqlite":
        return DatabaseConfig(engine="sqlite", path=f"{db_config.path}.{round_no}")
    import psycopg
    from psycopg import sql

    schema = f"{db_config.schema}_{round_no}"
    with psycopg.connect(db_config.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    return DatabaseConfig(engine="postgres", dsn=db_config.dsn, schema=schema, pool_min=1)


def test_migrate_processes_started_together_all_succeed(
    db_config: DatabaseConfig, tmp_path: Path
) -> None:
    for round_no in range(ROUNDS):
        database = _fresh(db_config, round_no)
        config = tmp_path / f"roomstream{round_no}.yaml"
        config.write_text(yaml.safe_dump({"database": _database_section(database)}))
        procs = [_start(["-c", str(config), "migrate"], tmp_path) for _ in range(PROCESSES)]
        outputs = [p.communicate(timeout=120)[0] for p in procs]
        for proc, output in zip(procs, outputs, strict=True):
            assert proc.returncode == 0, output
            assert "schema at version" in output, output


def test_run_processes_started_together_all_come_up(
    db_config: DatabaseConfig, tmp_path: Path
) -> None:
    """The README's example: two event writers and a reader, started at once."""
    names = ["writer1", "writer2", "reader"]
    config = tmp_path / "roomstream.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "server_name": "example.org",
                "data_dir": str(tmp_path / "data"),
                "database": _database_section(db_config),
                "stream_writers": {"events": ["writer1", "writer2"]},
                "instances": {
                    name: {
                        "replication_port": free_port(),
                        "http_port": free_port(),
                        "internal_port": free_port(),
                    }
                    for name in names
                },
            }
        )
    )
    logs = {name: tmp_path / f"{name}.log" for name in names}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name in names:
            with open(logs[name], "wb") as log:
                procs[name] = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "roomstream.cli",
                        "-c",
                        str(config),
                        "run",
                        "--instance",
                        name,
                    ],
                    cwd=tmp_path,
                    env=_env(),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
        deadline = time.monotonic() + 120
        pending = set(names)
        while pending:
            for name in sorted(pending):
                text = logs[name].read_text(errors="replace")
                assert procs[name].poll() is None, f"{name} exited:\n{text}"
                if f"roomstream instance {name} ready" in text:
                    pending.discard(name)
            assert time.monotonic() < deadline, f"not ready in time: {sorted(pending)}"
            time.sleep(0.05)
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    for name, proc in procs.items():
        assert proc.returncode == 0, logs[name].read_text(errors="replace")
