"""matrix-js-sdk with its Rust crypto (``initRustCrypto``, in-memory store) against a real
``roomstream run`` process, on SQLite and PostgreSQL.

``js/e2e.mjs``: two users, a room created with ``m.room.encryption``, each reads the other's
message decrypted; the room's messages are stored as ``m.room.encrypted`` only.

``js/e2e_devices.mjs``: a user's second device. Cross-signing is set up (no auth for the
first keys) and replaced (the password, through user-interactive auth); secret storage under
a recovery key holds the cross-signing keys and the key backup's key; the room key reaches
the server-side backup. The second device decrypts a message sent before it existed only
after restoring the backup (the Rust crypto sends no room key requests, so the key came
from the backup); it takes the cross-signing keys from secret storage, signs itself, and the
first device sees it cross-signing verified. The other user's client, syncing throughout,
learns of the new device and its signature through ``device_lists`` and decrypts what it
sends."""

from __future__ import annotations

from tests.support.homeserver import RunningServer
from tests.support.js_sdk import JS_DIR, run_script


def _require_rust_crypto() -> None:
    assert (JS_DIR / "node_modules" / "@matrix-org" / "matrix-sdk-crypto-wasm").is_dir(), (
        "matrix-js-sdk's Rust crypto is not installed: run `make setup`"
    )


async def test_two_users_exchange_encrypted_messages(running_server: RunningServer) -> None:
    _require_rust_crypto()
    report = await run_script("e2e.mjs", running_server.url)
    assert report["encrypted"] is True
    assert "secret from alice" in report["bobRead"]
    assert "secret from bob" in report["aliceRead"]
    assert "m.room.message" not in report["types"]  # no plaintext reached the server
    assert "m.room.encrypted" in report["types"]


async def test_second_device_backup_cross_signing_and_device_lists(
    running_server: RunningServer,
) -> None:
    _require_rust_crypto()
    report = await run_script("e2e_devices.mjs", running_server.url)
    first, second = report["firstDeviceId"], report["secondDeviceId"]
    assert first != second

    # 1. Cross-signing: the first keys need no auth, replacing them the password; the
    # replacement is what the server hands out. Secret storage and key backup set up.
    assert report["uia"] == ["none", "m.login.password"]
    old_master, master = report["masterKeys"]
    assert old_master and master and old_master != master
    assert report["crossSigningKeyId"] == master
    assert report["crossSigningReady"] is True
    assert report["secretStorageReady"] is True
    assert report["backupVersion"]
    assert report["backupTrusted"] is True
    assert report["backupActive"] is True
    assert report["backedUpSessions"] >= 1
    assert report["bobSawBefore"] == [first]

    # 2. The second device: the history is undecryptable until the backup is restored.
    assert report["historyBeforeRestore"]["encryptedEvents"] >= 1
    assert "before the second device" not in report["historyBeforeRestore"]["decrypted"]
    assert report["secondBackupVersion"] == report["backupVersion"]
    assert report["restored"]["total"] >= 1
    assert report["restored"]["imported"] >= 1
    assert "before the second device" in report["secondRead"]

    # 3. It imported the cross-signing keys (no new upload, same master key) and signed
    # itself; the first device sees it cross-signing verified.
    assert report["uiaAfterSecond"] == report["uia"]
    assert report["secondCrossSigningReady"] is True
    assert report["secondCrossSigningKeyId"] == master
    assert report["finalMasterKey"] == master
    assert report["firstSeesSecond"]["crossSigningVerified"] is True
    assert report["firstSeesSecond"]["signedByOwner"] is True
    assert report["firstSeesSecond"]["localVerified"] is False  # by the signature alone

    # 4. Bob's running client sees the new device, signed by Alice, and decrypts it.
    assert report["bobSees"] == sorted([first, second])
    assert report["bobSeesSecond"]["signedByOwner"] is True
    assert "from the second device" in report["bobRead"]
    assert report["fromSecond"] == {"sender": "@alice:test.local", "wireType": "m.room.encrypted"}
