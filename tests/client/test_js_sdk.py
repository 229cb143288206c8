"""matrix-js-sdk (the SDK under Element Web) against a real ``roomstream run`` process, on
SQLite and PostgreSQL: the scenario in ``js/scenario.mjs`` (register, sync, create,
invite, join, messages seen through long-polling syncs, redact, page back, topic, leave,
and a room whose history a later joiner may only partly see)."""

from __future__ import annotations

from tests.support.homeserver import RunningServer
from tests.support.js_sdk import JS_DIR, run_script


async def test_matrix_js_sdk_scenario(running_server: RunningServer) -> None:
    assert (JS_DIR / "node_modules" / "matrix-js-sdk").is_dir(), (
        "matrix-js-sdk is not installed: run `make setup` (npm ci in tests/client/js)"
    )
    report = await run_script("scenario.mjs", running_server.url)
    assert report["bob_saw"] == ["hi bob", "hi alice"]
    assert report["paged_back"] == [f"n{i}" for i in range(24, -1, -1)] + ["hi alice", "<redacted>"]
    assert report["topic"] == "js topic" and report["bob_left"] is True
    assert report["carol_paged"] == ["after carol"]
    assert report["alice_paged"] == ["after carol", "before carol"]


async def test_matrix_js_sdk_sliding_sync(running_server: RunningServer) -> None:
    """matrix-js-sdk's SlidingSync over simplified sliding sync: the room list with names
    and one event a room, then a message arriving through its long poll."""
    report = await run_script("sliding.mjs", running_server.url)
    assert report["count"] == 3
    assert report["names"] == ["js 0", "js 1", "js 2"]
    assert report["seen"] == [["first 0", "live"], ["first 1"], ["first 2"]]
