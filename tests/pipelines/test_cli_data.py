"""The data engineer's command line, run as a user would: generate, import, views.

Spark's own logs and stage bars stay quiet by default; ``import`` names the real problem
of a create event with an unknown or mistyped room version; ``views`` says which tables
and Parquet paths it wrote and what they hold.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.support import command

pytestmark = pytest.mark.spark

_SPARK_NOISE = re.compile(r"\bWARN\b|\[Stage \d+|Setting default log level|log4j")


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # Wide enough for the views' tables; Spark jobs take minutes here.
    return command.run_cli(*args, cwd=cwd, columns=250, timeout=600)


def _break_create_events(corpus: Path) -> dict[int, object]:
    """Give two create events a bad room version (unknown; an integer). Returns the line
    numbers (1-based) changed and the value each now holds."""
    lines = corpus.read_bytes().splitlines()
    changed: dict[int, object] = {}
    for index, raw in enumerate(lines):
        data = json.loads(raw)
        if isinstance(data, dict) and data.get("type") == "m.room.create":
            bad: object = "13" if not changed else 12
            data["content"]["room_version"] = bad
            lines[index] = json.dumps(data).encode()
            changed[index + 1] = bad
            if len(changed) == 2:
                break
    corpus.write_bytes(b"\n".join(lines) + b"\n")
    return changed


def test_generate_import_views_as_a_data_engineer(tmp_path: Path) -> None:
    (tmp_path / "roomstream.yaml").write_text("data_dir: data\n")
    generated = run_cli("-c", "roomstream.yaml", "generate", "corpus.jsonl", "--events", "300",
                        "--workers", "1", cwd=tmp_path)  # fmt: skip
    assert generated.returncode == 0, generated.stderr
    changed = _break_create_events(tmp_path / "corpus.jsonl")
    assert len(changed) == 2

    imported = run_cli("-c", "roomstream.yaml", "import", "corpus.jsonl", "--keys",
                       "corpus.jsonl.keys.json", "--report", "issues.jsonl", "--partitions", "2",
                       cwd=tmp_path)  # fmt: skip
    assert imported.returncode == 0, imported.stdout + imported.stderr
    output = imported.stdout + imported.stderr
    assert not _SPARK_NOISE.search(output), output
    issues = {
        issue["line"]: issue
        for issue in map(json.loads, (tmp_path / "issues.jsonl").read_text().splitlines())
    }
    unknown, mistyped = sorted(changed)
    assert issues[unknown]["reason"] == (
        "M_UNSUPPORTED_ROOM_VERSION: unknown room version '13' in the m.room.create event"
        " (supported: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)"
    )
    assert issues[mistyped]["reason"] == (
        "M_UNSUPPORTED_ROOM_VERSION: content.room_version of the m.room.create event must be"
        " a string, not int 12 (supported: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)"
    )

    views = run_cli("-c", "roomstream.yaml", "views", "--rebuild", "--parquet", "pq",
                    cwd=tmp_path)  # fmt: skip
    assert views.returncode == 0, views.stdout + views.stderr
    output = views.stdout + views.stderr
    assert not _SPARK_NOISE.search(output), output
    assert "views rebuilt up to" not in output
    assert "views written to SQLite data/roomstream.db" in views.stdout, views.stdout
    for table in ("view_room_state", "view_room_stats", "view_room_daily_messages",
                  "view_user_stats", "view_user_directory"):  # fmt: skip
        row = next(line for line in views.stdout.splitlines() if f" {table} " in line)
        assert f"pq/{table}" in row, views.stdout
        assert (tmp_path / "pq" / table).is_dir()
    assert re.search(r"\d+ rooms, \d+ users, [\d,]+ messages", views.stdout), views.stdout
    assert "events stream up to main " in views.stdout
