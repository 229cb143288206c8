"""matrix-js-sdk and relations against a real ``roomstream run`` process, on SQLite and
PostgreSQL: a thread with replies, an edit (``m.replace``) and a reaction
(``m.annotation``), each seen by the other user through sync: the replies in the root's
thread (not the main timeline), the edit applied to the root by the client, the reaction
in the client's relations and through ``/relations``; and the server's thread summary
(``unsigned.m.relations.m.thread``) on the root for a client that starts afterwards."""

from __future__ import annotations

from tests.support.homeserver import RunningServer
from tests.support.js_sdk import JS_DIR, run_script


async def test_matrix_js_sdk_sees_a_thread_an_edit_and_a_reaction(
    running_server: RunningServer,
) -> None:
    assert (JS_DIR / "node_modules" / "matrix-js-sdk").is_dir(), (
        "matrix-js-sdk is not installed: run `make setup` (npm ci in tests/client/js)"
    )
    report = await run_script("relations.mjs", running_server.url)
    replies = report["replies"]
    assert len(replies) == 3
    assert sorted(report["live_thread_replies"]) == sorted(replies)
    assert report["live_thread_length"] == 3
    assert report["replies_in_main_timeline"] == 0
    assert report["edited_body"] == "root (edited)"
    assert report["live_reactions"] == [["👍", 1]]
    assert report["summary_count"] == 3
    assert report["summary_latest"] == replies[-1]
    assert report["summary_participated"] is True  # bob wrote the last reply
    assert report["later_root_body"] == "root (edited)"
    assert report["fetched_reactions"] == [[report["reaction"], "👍"]]
    assert report["threads"] == [report["root"]]
