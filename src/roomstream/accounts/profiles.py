"""Local users' global profiles: a display name and an avatar URL (the ``profiles`` table,
migration 0012; this module is its one writer).

Invariants: a profile row exists exactly for each local user (created in the user's own
transaction by :func:`create_profile_txn`; the migration gave one to every user before
it); a stored value is never the empty string (an empty value is stored as NULL, unset),
never longer than :data:`MAX_DISPLAYNAME_LENGTH` / :data:`MAX_AVATAR_URL_LENGTH`
characters (checked by the caller, :mod:`roomstream.client.profiles`).

Nothing is cached: every process reads the row when it needs it (a profile read is one
primary-key look-up, done once per membership event made and per profile request), so a
change made on any process is seen by every other at once, with no invalidation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from roomstream.storage import Database, Transaction

__all__ = [
    "MAX_AVATAR_URL_LENGTH",
    "MAX_DISPLAYNAME_LENGTH",
    "PROFILE_FIELDS",
    "Profile",
    "ProfileStore",
    "create_profile_txn",
]

#: Synapse's limits (``synapse.handlers.profile``), in characters.
MAX_DISPLAYNAME_LENGTH = 256
MAX_AVATAR_URL_LENGTH = 1000
#: The profile's fields, which are also the keys a membership event carries them under.
PROFILE_FIELDS = ("displayname", "avatar_url")


@dataclass(frozen=True, slots=True)
class Profile:
    """One user's profile; None: unset."""

    displayname: str | None = None
    avatar_url: str | None = None

    def get(self, field: str) -> str | None:
        if field == "displayname":
            return self.displayname
        if field == "avatar_url":
            return self.avatar_url
        raise KeyError(field)

    def to_json(self) -> dict[str, Any]:
        """The fields that are set (``GET /profile/{userId}``; also the keys a new
        membership event of the user carries)."""
        return {f: v for f in PROFILE_FIELDS if (v := self.get(f)) is not None}


def create_profile_txn(txn: Transaction, user_id: str, displayname: str | None) -> None:
    """The profile of a user being created (in the transaction that creates the user)."""
    txn.execute(
        "INSERT INTO profiles (user_id, displayname, avatar_url) VALUES (?, ?, NULL)",
        (user_id, displayname or None),
    )


class ProfileStore:
    """Reads and writes of ``profiles``; every method is one transaction."""

    def __init__(self, database: Database) -> None:
        self.db = database

    async def get(self, user_id: str) -> Profile | None:
        """The user's profile; None if there is no such local user."""
        row = await self.db.run_interaction(
            "get_profile",
            lambda t: t.query_one(
                "SELECT displayname, avatar_url FROM profiles WHERE user_id = ?", (user_id,)
            ),
        )
        return None if row is None else Profile(row[0], row[1])

    async def set_field(self, user_id: str, field: str, value: str | None) -> bool:
        """Set one field (``displayname`` or ``avatar_url``; None or "" unsets it);
        False if there is no such local user."""
        if field not in PROFILE_FIELDS:
            raise ValueError(f"not a profile field: {field}")

        def txn(t: Transaction) -> bool:
            # The column name comes from PROFILE_FIELDS, never from the request.
            t.execute(
                f"UPDATE profiles SET {field} = ? WHERE user_id = ?", (value or None, user_id)
            )
            return t.rowcount > 0

        return await self.db.run_interaction("set_profile_field", txn)

    async def member_content(self, user_id: str) -> dict[str, Any]:
        """What a new membership event of ``user_id`` carries from the profile (the set
        fields; nothing for a user who is not local or has no profile)."""
        profile = await self.get(user_id)
        return {} if profile is None else profile.to_json()
