"""OpenID tokens: a user proves who they are to a third party (a widget, Element Call)
without giving it their access token.

``POST /user/{id}/openid/request_token`` issues a token (:meth:`OpenIdTokens.issue`); the
third party asks this server's ``GET /_matrix/federation/v1/openid/userinfo`` whom it
belongs to (:meth:`OpenIdTokens.user_for`). Invariants: a token is stored only as its
SHA-256 (as access tokens are), names exactly one user, is valid for
:data:`OPENID_TOKEN_LIFETIME_MS` from its issue and never after, and authenticates nothing
else (it is not an access token). Expired rows are deleted when the next token is issued.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from roomstream.accounts.tokens import token_hash
from roomstream.storage import Database, Transaction

__all__ = ["OPENID_TOKEN_LIFETIME_MS", "OpenIdToken", "OpenIdTokens"]

#: How long an OpenID token is valid (one hour, as Synapse).
OPENID_TOKEN_LIFETIME_MS = 3_600_000


@dataclass(frozen=True, slots=True)
class OpenIdToken:
    access_token: str
    expires_in_s: int


class OpenIdTokens:
    def __init__(
        self,
        database: Database,
        *,
        clock: Callable[[], float] = time.time,
        lifetime_ms: int = OPENID_TOKEN_LIFETIME_MS,
    ) -> None:
        self.db = database
        self.clock = clock
        self.lifetime_ms = lifetime_ms

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    async def issue(self, user_id: str) -> OpenIdToken:
        """A new token for ``user_id`` (one transaction, which also drops expired ones)."""
        token = secrets.token_urlsafe(32)
        now = self._now_ms()

        def txn(t: Transaction) -> None:
            t.execute("DELETE FROM openid_tokens WHERE expires_ts <= ?", (now,))
            t.execute(
                "INSERT INTO openid_tokens (token_hash, user_id, expires_ts) VALUES (?, ?, ?)",
                (token_hash(token), user_id, now + self.lifetime_ms),
            )

        await self.db.run_interaction("openid_issue_token", txn)
        return OpenIdToken(token, self.lifetime_ms // 1000)

    async def user_for(self, token: str) -> str | None:
        """The user a live token was issued to; None if unknown or expired."""
        row = await self.db.run_interaction(
            "openid_token_owner",
            lambda t: t.query_one(
                "SELECT user_id FROM openid_tokens WHERE token_hash = ? AND expires_ts > ?",
                (token_hash(token), self._now_ms()),
            ),
        )
        return None if row is None else str(row[0])
