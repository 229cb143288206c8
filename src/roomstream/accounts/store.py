"""SQL for users, devices and access tokens (tables of migrations 0006 and 0014); a new
user's profile is created with the user
(:func:`~roomstream.accounts.profiles.create_profile_txn`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from roomstream.accounts.profiles import create_profile_txn
from roomstream.storage import Database, Transaction

__all__ = ["AccountStore", "UserExistsError", "UserRecord"]


class UserExistsError(Exception):
    """The user ID is taken."""


@dataclass(frozen=True, slots=True)
class UserRecord:
    user_id: str
    password_hash: str | None
    admin: bool
    deactivated: bool
    is_guest: bool = False


def _now_ms() -> int:
    return int(time.time() * 1000)


def _earlier_registration(
    t: Transaction, registration_session: str | None, since_ms: int
) -> str | None:
    """The user an earlier registration through ``registration_session`` made at or
    after ``since_ms`` (an older one is forgotten), if any."""
    if registration_session is None:
        return None
    t.execute(
        "DELETE FROM registration_sessions WHERE session_id = ? AND created_ts < ?",
        (registration_session, since_ms),
    )
    row = t.query_one(
        "SELECT user_id FROM registration_sessions WHERE session_id = ?",
        (registration_session,),
    )
    return None if row is None else str(row[0])


def _remember_registration(
    t: Transaction, registration_session: str | None, user_id: str, now: int
) -> None:
    if registration_session is not None:
        t.execute(
            "INSERT INTO registration_sessions (session_id, user_id, created_ts) VALUES (?, ?, ?)",
            (registration_session, user_id, now),
        )


class AccountStore:
    """Users, devices and access tokens. Every method is one transaction."""

    def __init__(self, database: Database) -> None:
        self.db = database

    async def create_user(
        self,
        user_id: str,
        password_hash: str | None,
        admin: bool,
        *,
        registration_session: str | None = None,
        session_since_ms: int = 0,
        is_guest: bool = False,
    ) -> str:
        """Create ``user_id``; returns the user that ``registration_session`` (a
        user-interactive-auth session) registered: this one, or the one an earlier
        registration through the same session made at or after ``session_since_ms``
        (then nothing is created; an older one is forgotten). The user's profile is
        created in the same transaction, with the localpart as display name (Synapse's
        default)."""

        def txn(t: Transaction) -> str:
            earlier = _earlier_registration(t, registration_session, session_since_ms)
            if earlier is not None:
                return earlier
            if t.query_one("SELECT 1 FROM users WHERE user_id = ?", (user_id,)) is not None:
                raise UserExistsError(user_id)
            now = _now_ms()
            t.execute(
                "INSERT INTO users"
                " (user_id, password_hash, admin, deactivated, creation_ts, is_guest)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (user_id, password_hash, admin, False, now, is_guest),
            )
            create_profile_txn(t, user_id, user_id[1:].partition(":")[0])
            _remember_registration(t, registration_session, user_id, now)
            return user_id

        return await self.db.run_interaction("create_user", txn)

    async def upgrade_guest(
        self,
        user_id: str,
        password_hash: str | None,
        *,
        registration_session: str | None = None,
        session_since_ms: int = 0,
    ) -> str | None:
        """Make the active guest ``user_id`` a full account with ``password_hash``; the
        user that ``registration_session`` registered (as :meth:`create_user`: this one,
        or an earlier registration's), or None if ``user_id`` is no longer an active
        guest (upgraded meanwhile, or deactivated): then nothing changed."""

        def txn(t: Transaction) -> str | None:
            earlier = _earlier_registration(t, registration_session, session_since_ms)
            if earlier is not None:
                return earlier
            now = _now_ms()
            t.execute(
                "UPDATE users SET password_hash = ?, is_guest = ?, upgrade_ts = ?"
                " WHERE user_id = ? AND is_guest = ? AND deactivated = ?",
                (password_hash, False, now, user_id, True, False),
            )
            if t.rowcount == 0:
                return None
            _remember_registration(t, registration_session, user_id, now)
            return user_id

        return await self.db.run_interaction("upgrade_guest", txn)

    async def set_password_hash(self, user_id: str, password_hash: str) -> bool:
        """Replace an active user's password hash; False if there is no such user."""

        def txn(t: Transaction) -> bool:
            t.execute(
                "UPDATE users SET password_hash = ? WHERE user_id = ? AND deactivated = ?",
                (password_hash, user_id, False),
            )
            return t.rowcount > 0

        return await self.db.run_interaction("set_password_hash", txn)

    async def deactivate_user(self, user_id: str) -> None:
        """Mark the user deactivated and forget its password (as Synapse): its tokens
        stop authenticating (:meth:`get_token_owner`) and it can never log in again."""
        await self.db.run_interaction(
            "deactivate_user",
            lambda t: t.execute(
                "UPDATE users SET deactivated = ?, password_hash = NULL WHERE user_id = ?",
                (True, user_id),
            ),
        )

    async def registered_by_session(self, session_id: str, since_ms: int) -> str | None:
        """The user a registration through ``session_id`` created at or after
        ``since_ms`` (ms since the epoch), if any."""
        row = await self.db.run_interaction(
            "registered_by_session",
            lambda t: t.query_one(
                "SELECT user_id FROM registration_sessions"
                " WHERE session_id = ? AND created_ts >= ?",
                (session_id, since_ms),
            ),
        )
        return None if row is None else str(row[0])

    async def get_user(self, user_id: str) -> UserRecord | None:
        row = await self.db.run_interaction(
            "get_user",
            lambda t: t.query_one(
                "SELECT user_id, password_hash, admin, deactivated, is_guest FROM users"
                " WHERE user_id = ?",
                (user_id,),
            ),
        )
        if row is None:
            return None
        return UserRecord(row[0], row[1], bool(row[2]), bool(row[3]), bool(row[4]))

    async def login_device(
        self, user_id: str, device_id: str, display_name: str | None, token_hash: str
    ) -> bool:
        """Create the device if new (keeping an existing one's name unless given) and
        add an access token for it, in one transaction; whether an existing device's
        name changed (others learn of that as of a rename)."""

        def txn(t: Transaction) -> bool:
            existing = t.query_one(
                "SELECT display_name FROM devices WHERE user_id = ? AND device_id = ?",
                (user_id, device_id),
            )
            renamed = False
            if existing is None:
                t.execute(
                    "INSERT INTO devices (user_id, device_id, display_name, created_ts)"
                    " VALUES (?, ?, ?, ?)",
                    (user_id, device_id, display_name, _now_ms()),
                )
            elif display_name is not None and display_name != existing[0]:
                t.execute(
                    "UPDATE devices SET display_name = ? WHERE user_id = ? AND device_id = ?",
                    (display_name, user_id, device_id),
                )
                renamed = True
            t.execute(
                "INSERT INTO access_tokens (token_hash, user_id, device_id, created_ts)"
                " VALUES (?, ?, ?, ?)",
                (token_hash, user_id, device_id, _now_ms()),
            )
            return renamed

        return await self.db.run_interaction("login_device", txn)

    async def get_token_owner(self, token_hash: str) -> tuple[str, str] | None:
        """(user ID, device ID) of a live token of an active user, or None."""
        row = await self.db.run_interaction(
            "get_token_owner",
            lambda t: t.query_one(
                "SELECT a.user_id, a.device_id FROM access_tokens a"
                " JOIN users u ON u.user_id = a.user_id"
                " WHERE a.token_hash = ? AND u.deactivated = ?",
                (token_hash, False),
            ),
        )
        return None if row is None else (row[0], row[1])

    async def delete_device(
        self, user_id: str, device_id: str, also: Callable[[Transaction], None] | None = None
    ) -> None:
        """Log a device out: its tokens and the device itself go (``also`` runs in the
        same transaction: the cache invalidation)."""

        def txn(t: Transaction) -> None:
            if also is not None:
                also(t)
            t.execute(
                "DELETE FROM access_tokens WHERE user_id = ? AND device_id = ?",
                (user_id, device_id),
            )
            t.execute(
                "DELETE FROM devices WHERE user_id = ? AND device_id = ?", (user_id, device_id)
            )

        await self.db.run_interaction("delete_device", txn)

    async def delete_all_devices(
        self, user_id: str, also: Callable[[Transaction], None] | None = None
    ) -> None:
        def txn(t: Transaction) -> None:
            if also is not None:
                also(t)
            t.execute("DELETE FROM access_tokens WHERE user_id = ?", (user_id,))
            t.execute("DELETE FROM devices WHERE user_id = ?", (user_id,))

        await self.db.run_interaction("delete_all_devices", txn)

    async def delete_other_sessions(
        self,
        user_id: str,
        keep_device: str,
        keep_token_hash: str | None,
        also: Callable[[Transaction], None] | None = None,
    ) -> list[str]:
        """Log out every device of the user but ``keep_device``, and every token of
        ``keep_device`` but ``keep_token_hash`` (as Synapse does on a password change);
        the device IDs deleted."""

        def txn(t: Transaction) -> list[str]:
            if also is not None:
                also(t)
            gone = [
                str(r[0])
                for r in t.query(
                    "SELECT device_id FROM devices WHERE user_id = ? AND device_id <> ?"
                    " ORDER BY device_id",
                    (user_id, keep_device),
                )
            ]
            t.execute(
                "DELETE FROM access_tokens WHERE user_id = ? AND device_id <> ?",
                (user_id, keep_device),
            )
            t.execute(
                "DELETE FROM access_tokens WHERE user_id = ? AND device_id = ? AND token_hash <> ?",
                (user_id, keep_device, keep_token_hash or ""),
            )
            t.execute(
                "DELETE FROM devices WHERE user_id = ? AND device_id <> ?", (user_id, keep_device)
            )
            return gone

        return await self.db.run_interaction("delete_other_sessions", txn)

    async def get_devices(self, user_id: str) -> list[tuple[str, str | None]]:
        rows = await self.db.run_interaction(
            "get_devices",
            lambda t: t.query(
                "SELECT device_id, display_name FROM devices WHERE user_id = ? ORDER BY device_id",
                (user_id,),
            ),
        )
        return [(r[0], r[1]) for r in rows]

    async def get_device(self, user_id: str, device_id: str) -> tuple[str, str | None] | None:
        row = await self.db.run_interaction(
            "get_device",
            lambda t: t.query_one(
                "SELECT device_id, display_name FROM devices WHERE user_id = ? AND device_id = ?",
                (user_id, device_id),
            ),
        )
        return None if row is None else (row[0], row[1])

    async def rename_device(self, user_id: str, device_id: str, display_name: str) -> bool:
        """Set a device's display name; False if the user has no such device."""

        def txn(t: Transaction) -> bool:
            t.execute(
                "UPDATE devices SET display_name = ? WHERE user_id = ? AND device_id = ?",
                (display_name, user_id, device_id),
            )
            return t.rowcount > 0

        return await self.db.run_interaction("rename_device", txn)
