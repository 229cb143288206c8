"""Server-side key backup (``/room_keys/...``): versions, and the session keys of one
version, replaced only by better ones (:func:`~roomstream.e2e.backup_rule.replaces`).

Invariants: version numbers of a user only grow (a deleted one is never reused); the
current version is the newest not deleted; keys are written only to the current version
(else 403 ``M_WRONG_ROOM_KEYS_VERSION`` with ``current_version``); a version's ``etag``
changes whenever its keys do, and each answer carries the ``count`` of keys it holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from roomstream.e2e import backup_store as bs
from roomstream.e2e.backup_rule import SessionQuality, replaces
from roomstream.errors import (
    BadJsonError,
    InvalidParamError,
    MatrixError,
    NotFoundError,
    WrongRoomKeysVersionError,
)
from roomstream.storage import Database, Transaction

__all__ = [
    "KeyBackup",
    "SessionUpload",
    "parse_rooms",
    "parse_session",
    "parse_sessions",
    "sessions_json",
]

#: (room ID, session ID, quality, session_data)
SessionUpload = tuple[str, str, SessionQuality, Any]


def _no_backup() -> MatrixError:
    return NotFoundError("no current backup version")


def parse_version(raw: str | None) -> int:
    """A version as the client gives it (a decimal string); 404 for one that cannot exist."""
    if raw is None or not raw.isascii() or not raw.isdigit() or len(raw) > 18:
        raise NotFoundError(f"unknown backup version {str(raw)[:40]!r}")
    return int(raw)


def parse_session(data: Any) -> tuple[SessionQuality, Any]:
    """A ``KeyBackupData`` object: M_BAD_JSON (400) if malformed."""

    def bad(message: str) -> MatrixError:
        return BadJsonError(message)

    if not isinstance(data, dict):
        raise bad("a session key must be an object")
    index, forwarded = data.get("first_message_index"), data.get("forwarded_count")
    verified, session_data = data.get("is_verified"), data.get("session_data")
    for name, value in (("first_message_index", index), ("forwarded_count", forwarded)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**53:
            raise bad(f"{name} must be a non-negative integer")
    if not isinstance(verified, bool):
        raise bad("is_verified must be a boolean")
    if not isinstance(session_data, dict):
        raise bad("session_data must be an object")
    assert isinstance(index, int) and isinstance(forwarded, int)
    return SessionQuality(verified, index, forwarded), session_data


class KeyBackup:
    def __init__(self, database: Database) -> None:
        self.db = database

    # -- versions -------------------------------------------------------------------------

    async def create_version(self, user_id: str, algorithm: str, auth_data: Any) -> str:
        version = await self.db.run_interaction(
            "backup_create_version", bs.create_version_txn, user_id, algorithm, auth_data
        )
        return str(version)

    async def get_version(self, user_id: str, version: str | None) -> dict[str, Any]:
        """The current version (``version`` None) or the one named; 404 if none."""

        def txn(t: Transaction) -> dict[str, Any]:
            found = (
                bs.current_version_txn(t, user_id)
                if version is None
                else bs.get_version_txn(t, user_id, parse_version(version))
            )
            if found is None:
                raise _no_backup()
            number, algorithm, auth_data, etag = found
            return {
                "version": str(number),
                "algorithm": algorithm,
                "auth_data": auth_data,
                "etag": str(etag),
                "count": bs.count_keys_txn(t, user_id, number),
            }

        return await self.db.run_interaction("backup_get_version", txn)

    async def update_version(
        self, user_id: str, version: str, algorithm: str, auth_data: Any, body_version: Any
    ) -> None:
        number = parse_version(version)
        if body_version is not None and body_version != version:
            raise InvalidParamError("version in the body does not match")

        def txn(t: Transaction) -> None:
            found = bs.get_version_txn(t, user_id, number)
            if found is None:
                raise _no_backup()
            if found[1] != algorithm:
                raise InvalidParamError("algorithm cannot be changed")
            bs.update_version_txn(t, user_id, number, auth_data)

        await self.db.run_interaction("backup_update_version", txn)

    async def delete_version(self, user_id: str, version: str) -> None:
        number = parse_version(version)

        def txn(t: Transaction) -> None:
            if bs.get_version_txn(t, user_id, number) is None:
                raise _no_backup()
            bs.delete_version_txn(t, user_id, number)

        await self.db.run_interaction("backup_delete_version", txn)

    # -- keys -----------------------------------------------------------------------------

    async def put_keys(
        self, user_id: str, version: str | None, sessions: list[SessionUpload]
    ) -> dict[str, Any]:
        """Store each session key that beats the stored one; ``{etag, count}``."""
        number = parse_version(version)

        def txn(t: Transaction) -> dict[str, Any]:
            current = bs.current_version_txn(t, user_id)
            if current is None:
                raise _no_backup()
            if current[0] != number:
                raise WrongRoomKeysVersionError(current_version=current[0])
            changed = False
            for room_id, session_id, quality, data in sessions:
                stored = bs.get_session_quality_txn(t, user_id, number, room_id, session_id)
                if replaces(quality, stored):
                    bs.put_session_txn(t, user_id, number, room_id, session_id, quality, data)
                    changed = True
            etag = current[3]
            if changed:
                bs.bump_etag_txn(t, user_id, number)
                etag += 1
            return {"etag": str(etag), "count": bs.count_keys_txn(t, user_id, number)}

        return await self.db.run_interaction("backup_put_keys", txn)

    async def get_keys(
        self, user_id: str, version: str | None, room_id: str | None, session_id: str | None
    ) -> list[bs.StoredSession]:
        number = parse_version(version)

        def txn(t: Transaction) -> list[bs.StoredSession]:
            if bs.get_version_txn(t, user_id, number) is None:
                raise _no_backup()
            return bs.get_keys_txn(t, user_id, number, room_id, session_id)

        return await self.db.run_interaction("backup_get_keys", txn)

    async def delete_keys(
        self, user_id: str, version: str | None, room_id: str | None, session_id: str | None
    ) -> dict[str, Any]:
        number = parse_version(version)

        def txn(t: Transaction) -> dict[str, Any]:
            found = bs.get_version_txn(t, user_id, number)
            if found is None:
                raise _no_backup()
            etag = found[3]
            if bs.delete_keys_txn(t, user_id, number, room_id, session_id):
                bs.bump_etag_txn(t, user_id, number)
                etag += 1
            return {"etag": str(etag), "count": bs.count_keys_txn(t, user_id, number)}

        return await self.db.run_interaction("backup_delete_keys", txn)


def sessions_json(stored: list[bs.StoredSession]) -> dict[str, Any]:
    """``{"rooms": {room: {"sessions": {session: data}}}}``."""
    rooms: dict[str, Any] = {}
    for room_id, session_id, data in stored:
        rooms.setdefault(room_id, {"sessions": {}})["sessions"][session_id] = data
    return {"rooms": rooms}


def parse_rooms(body: Mapping[str, Any]) -> list[SessionUpload]:
    rooms = body.get("rooms")
    if not isinstance(rooms, dict):
        raise BadJsonError("rooms must be an object")
    uploads: list[SessionUpload] = []
    for room_id, room in rooms.items():
        if not isinstance(room, dict):
            raise BadJsonError("each room must be an object")
        uploads.extend(parse_sessions(room_id, room))
    return uploads


def parse_sessions(room_id: str, body: Mapping[str, Any]) -> list[SessionUpload]:
    sessions = body.get("sessions")
    if not isinstance(sessions, dict):
        raise BadJsonError("sessions must be an object")
    return [(room_id, sid, *parse_session(data)) for sid, data in sessions.items()]
