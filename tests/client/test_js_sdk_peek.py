"""matrix-js-sdk's room preview (``peekInRoom``: the room ``initialSync`` of a
``world_readable`` room the user is not in, then ``/events?room_id=`` for live events)
against a real ``roomstream run`` process, on SQLite and PostgreSQL."""

from __future__ import annotations

from tests.support.homeserver import RunningServer
from tests.support.js_sdk import JS_DIR, run_script


async def test_matrix_js_sdk_peeks_into_a_world_readable_room(
    running_server: RunningServer,
) -> None:
    assert (JS_DIR / "node_modules" / "matrix-js-sdk").is_dir(), (
        "matrix-js-sdk is not installed: run `make setup` (npm ci in tests/client/js)"
    )
    report = await run_script("peek.mjs", running_server.url)
    assert report["initial"] == ["before the peek"]
    assert report["name"] == "open room"
    assert report["after"] == ["before the peek", "live"]
