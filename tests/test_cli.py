"""The roomstream command, run as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "ROOMSTREAM_CONFIG"}
    env["COLUMNS"] = "200"
    return subprocess.run(
        [sys.executable, "-m", "roomstream.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


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
    assert "database.engine" in result.stdout
