"""matrix-js-sdk shows presence: a syncing user's room-mate sees them online, then, once
their client stops, unavailable and then offline after the server's timeouts (configured
short here: 1.5 s idle, 4 s sync), against a real ``roomstream run`` on both engines."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from roomstream.storage import DatabaseConfig
from tests.support.homeserver import RunningServer, serve_roomstream
from tests.support.js_sdk import JS_DIR, run_script

IDLE_S, SYNC_S = 1.5, 4.0
#: alice's client long-polls for this long (tests/client/js/presence.mjs).
POLL_S = 0.5


@pytest.fixture
async def short_presence_server(
    db_config: DatabaseConfig, tmp_path: Path
) -> AsyncIterator[RunningServer]:
    extra = {"presence": {"idle_timeout": IDLE_S, "sync_timeout": SYNC_S}}
    async with serve_roomstream(db_config, tmp_path, extra) as server:
        yield server


async def test_room_mate_sees_online_then_unavailable_then_offline(
    short_presence_server: RunningServer,
) -> None:
    assert (JS_DIR / "node_modules" / "matrix-js-sdk").is_dir(), (
        "matrix-js-sdk is not installed: run `make setup` (npm ci in tests/client/js)"
    )
    report = await run_script("presence.mjs", short_presence_server.url)
    seen = [(s["presence"], s["ms"]) for s in report["seen"]]
    before = [p for p, ms in seen if ms < 0]
    after = [(p, ms) for p, ms in seen if ms >= 0]
    assert before and before[-1] == "online", seen
    # Once alice's client stopped: unavailable, then offline, nothing else.
    assert [p for p, _ in after] == ["unavailable", "offline"], seen
    unavailable_ms, offline_ms = after[0][1], after[1][1]
    # Her last sync started about one long poll before she stopped (twice that allowed
    # for a loaded machine): the timeouts count from there, not from the test's start.
    assert unavailable_ms >= (IDLE_S - 2 * POLL_S) * 1000, seen
    assert offline_ms >= (SYNC_S - 2 * POLL_S) * 1000, seen
