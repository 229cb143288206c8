"""The roomstream command, run as a user would."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

from tests.support.command import run_cli
from tests.support.ports import free_port

from .conftest import pg_dsn


def test_run_creates_a_room_and_shows_the_events_stream(tmp_path: Path) -> None:
    first = run_cli("run", "--once", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert (tmp_path / "data" / "roomstream.db").exists()
    assert (tmp_path / "data" / "localhost.signing.key").exists()
    assert 'RDATA events main 1 ["ev",' in first.stdout
    assert '"m.room.create"' in first.stdout and '["state",' in first.stdout
    assert "events stream 0 -> 8" in first.stdout
    second = run_cli("run", "--once", cwd=tmp_path)
    # A second run continues the stream where the first left it, with the same key.
    assert "events stream 8 -> 16" in second.stdout, second.stdout


def test_bad_config_is_reported(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("database: {engine: oracle}\n")
    result = run_cli("-c", "bad.yaml", "migrate", cwd=tmp_path)
    assert result.returncode == 2
    assert "configuration error: database.engine" in result.stderr


def test_bad_config_is_one_line_per_mistake(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text(
        "instances: {w1: {http_port: eighty, replication_port: 70000}}\n"
        "stream_writers: {events: [w1, w2]}\n"
    )
    result = run_cli("-c", "bad.yaml", "migrate", cwd=tmp_path)
    assert result.returncode == 2
    assert sorted(result.stderr.splitlines()) == [
        "configuration error: instances.w1.http_port must be an integer, not 'eighty'",
        "configuration error: instances.w1.replication_port must be a port number in"
        " 1..65535, not 70000",
        "configuration error: stream_writers.events names 'w2', which is not among instances (w1)",
    ]


def test_port_in_use_at_start_up_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        (tmp_path / "roomstream.yaml").write_text(
            f"instances: {{main: {{replication_port: {free_port()}, http_port: {port}}}}}\n"
        )
        result = run_cli("-c", "roomstream.yaml", "run", cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert [line for line in result.stderr.splitlines() if "error" in line] == [
        f"configuration error: instances.main.http_port: port {port} on 127.0.0.1 is already in use"
    ]


def test_missing_postgres_database_fails_fast_in_one_line(tmp_path: Path) -> None:
    dsn = pg_dsn(f"roomstream_missing_{uuid.uuid4().hex[:8]}")
    (tmp_path / "roomstream.yaml").write_text(f"database: {{engine: postgres, dsn: '{dsn}'}}\n")
    for command in ("migrate", "run"):
        result = run_cli("-c", "roomstream.yaml", command, cwd=tmp_path)
        assert result.returncode == 1, result.stdout + result.stderr
        lines = result.stderr.splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith('error: PostgreSQL database "roomstream_missing_'), lines
        assert "does not exist on 127.0.0.1:5432: create it first (createdb" in lines[0]


def test_keys_add_list_and_a_clear_error(tmp_path: Path) -> None:
    key = "l8Hft5qXKn1vfHrg3p4+W8gELQVo8N13JkluMfmn2sQ"
    added = run_cli("keys", "add", "remote.example", "ed25519:a_1", key, cwd=tmp_path)
    assert added.returncode == 0, added.stdout + added.stderr
    assert "added remote.example ed25519:a_1" in added.stdout
    again = run_cli("keys", "add", "remote.example", "ed25519:a_1", key, cwd=tmp_path)
    assert again.returncode == 0 and "already known" in again.stdout
    (tmp_path / "keys.json").write_text('{"other.example": {"ed25519:x": "' + key + '"}}')
    imported = run_cli("keys", "import", "keys.json", cwd=tmp_path)
    assert "added other.example ed25519:x" in imported.stdout, imported.stdout
    listed = run_cli("keys", "list", cwd=tmp_path)
    assert listed.returncode == 0
    assert "remote.example" in listed.stdout and key in listed.stdout
    assert "other.example" in listed.stdout
    bad = run_cli("keys", "add", "remote.example", "rsa:1", key, cwd=tmp_path)
    assert bad.returncode == 2 and "ed25519:<version>" in bad.stdout
    short = run_cli("keys", "add", "remote.example", "ed25519:b", "AAAA", cwd=tmp_path)
    assert short.returncode == 2 and "32 bytes" in short.stdout


def test_register_creates_a_user_that_can_log_in(tmp_path: Path) -> None:
    import asyncio

    from roomstream.accounts import Accounts, AccountStore
    from roomstream.storage import DatabaseConfig, connect

    made = run_cli("register", "operator", "--password", "s3cret", "--admin", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert "registered @operator:localhost (admin)" in made.stdout
    again = run_cli("register", "operator", "--password", "other", cwd=tmp_path)
    assert again.returncode == 1 and "M_USER_IN_USE" in again.stdout

    async def login() -> str:
        db = connect(DatabaseConfig(engine="sqlite", path=str(tmp_path / "data" / "roomstream.db")))
        try:
            accounts = Accounts(AccountStore(db), "localhost")
            return (await accounts.login_with_password("operator", "s3cret")).user_id
        finally:
            await db.close()

    assert asyncio.run(login()) == "@operator:localhost"


def test_run_demo_serves_until_stopped(tmp_path: Path) -> None:
    """`make run`'s command: the demo waits for its own instance to answer (a refused
    connection while it starts is not an error), then serves the client API."""
    import json
    import subprocess
    import sys
    import urllib.request

    http_port = free_port()
    (tmp_path / "roomstream.yaml").write_text(
        f"instances: {{main: {{replication_port: {free_port()}, http_port: {http_port},"
        f" internal_port: {free_port()}}}}}\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "roomstream.cli", "-c", "roomstream.yaml", "run", "--demo"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:  # ends when the process exits
            seen.append(line)
            if "watch the events stream" in line:
                break
        assert proc.poll() is None, "".join(seen)
        url = f"http://127.0.0.1:{http_port}/_matrix/client/versions"
        with urllib.request.urlopen(url, timeout=30) as response:
            assert "v1.1" in json.load(response)["versions"]
    finally:
        proc.terminate()
        proc.wait(60)
