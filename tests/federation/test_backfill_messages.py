"""When ``/messages`` asks for older history (``client/read_routes.py`` with a fake
:class:`~roomstream.client.remote_history.RemoteHistory`): only for a backwards page
that came back short, with the page's size and some more, and whatever the other
servers do, the page is served from what is stored. Both engines."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from roomstream.client.remote_history import BACKFILL_EXTRA
from roomstream.errors import FederationUnreachableError
from roomstream.storage import DatabaseConfig
from tests.support.homeserver import Homeserver, make_config, serve_homeserver


class RecordingHistory:
    def __init__(self, *, fail: bool = False) -> None:
        self.calls: list[tuple[str, int]] = []
        self.fail = fail

    async def backfill(self, room_id: str, limit: int) -> int:
        self.calls.append((room_id, limit))
        if self.fail:
            raise FederationUnreachableError("remote.test", "connection refused")
        return 0


@pytest.fixture(params=[False, True], ids=["nothing-older", "server-down"])
def history(request: pytest.FixtureRequest) -> RecordingHistory:
    return RecordingHistory(fail=bool(request.param))


@pytest.fixture
async def homeserver(
    db_config: DatabaseConfig, tmp_path: Path, history: RecordingHistory
) -> AsyncIterator[Homeserver]:
    async with serve_homeserver(make_config(db_config, tmp_path), remote_history=history) as hs:
        yield hs


async def _room_with_messages(hs: Homeserver, count: int) -> tuple[str, str]:
    user = await hs.register("alice")
    room = (await hs.ok("POST", "/createRoom", {}, token=user.token))["room_id"]
    for i in range(count):
        await hs.ok(
            "PUT",
            f"/rooms/{quote(room)}/send/m.room.message/{hs.txn()}",
            {"msgtype": "m.text", "body": f"m{i}"},
            token=user.token,
        )
    return str(room), user.token


async def _page(hs: Homeserver, token: str, room: str, query: str) -> dict[str, Any]:
    answer: dict[str, Any] = await hs.ok(
        "GET", f"/rooms/{quote(room)}/messages?{query}", token=token
    )
    return answer


async def test_a_short_backwards_page_asks_once_and_is_served(
    homeserver: Homeserver, history: RecordingHistory
) -> None:
    room, token = await _room_with_messages(homeserver, 3)
    page = await _page(homeserver, token, room, "dir=b&limit=50")
    bodies = [e["content"]["body"] for e in page["chunk"] if e["type"] == "m.room.message"]
    assert bodies == ["m2", "m1", "m0"]
    assert history.calls == [(room, 50 + BACKFILL_EXTRA)]


async def test_a_full_page_or_a_forwards_one_asks_nothing(
    homeserver: Homeserver, history: RecordingHistory
) -> None:
    room, token = await _room_with_messages(homeserver, 5)
    full = await _page(homeserver, token, room, "dir=b&limit=3")
    assert len(full["chunk"]) == 3
    await _page(homeserver, token, room, "dir=f&limit=50")
    assert history.calls == []
    # Paginating on from the full page down to the room's start: then it asks.
    await _page(homeserver, token, room, f"dir=b&limit=50&from={quote(full['end'])}")
    assert history.calls == [(room, 50 + BACKFILL_EXTRA)]
