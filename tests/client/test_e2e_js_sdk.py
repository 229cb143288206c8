"""matrix-js-sdk with its Rust crypto (``initRustCrypto``, in-memory store) against a real
``roomstream run`` process, on SQLite and PostgreSQL: ``js/e2e.mjs`` (two users, a room
created with ``m.room.encryption``, each reads the other's message decrypted; the room's
messages are stored as ``m.room.encrypted`` only)."""

from __future__ import annotations

from tests.support.homeserver import RunningServer
from tests.support.js_sdk import JS_DIR, run_script


async def test_two_users_exchange_encrypted_messages(running_server: RunningServer) -> None:
    assert (JS_DIR / "node_modules" / "@matrix-org" / "matrix-sdk-crypto-wasm").is_dir(), (
        "matrix-js-sdk's Rust crypto is not installed: run `make setup`"
    )
    report = await run_script("e2e.mjs", running_server.url)
    assert report["encrypted"] is True
    assert "secret from alice" in report["bobRead"]
    assert "secret from bob" in report["aliceRead"]
    assert "m.room.message" not in report["types"]  # no plaintext reached the server
    assert "m.room.encrypted" in report["types"]
