"""Access tokens and device IDs: random, and tokens stored only as their SHA-256.

A token carries 256 random bits, so a plain SHA-256 (no salt, no slow hash) is enough to
make the stored value useless to someone who reads the database, and lets a request's
token be found with one indexed lookup.

A guest's tokens carry their own prefix (:data:`GUEST_TOKEN_PREFIX`), as Synapse's guest
macaroons carried a ``guest = true`` caveat: whether a request is a guest's is read from
its token, with no database read and nothing to cache. The prefix is covered by the
hash, so a token's kind cannot be changed without making it unknown; and every token of
a guest ends when the guest is upgraded to a full account, so a guest token never
belongs to a full account.
"""

from __future__ import annotations

import hashlib
import secrets
import string

__all__ = [
    "GUEST_TOKEN_PREFIX",
    "is_guest_token",
    "new_access_token",
    "new_device_id",
    "token_hash",
]

TOKEN_PREFIX = "rst_"
GUEST_TOKEN_PREFIX = "rsg_"
_DEVICE_ALPHABET = string.ascii_uppercase


def new_access_token(*, guest: bool = False) -> str:
    return (GUEST_TOKEN_PREFIX if guest else TOKEN_PREFIX) + secrets.token_urlsafe(32)


def is_guest_token(token: str) -> bool:
    """Whether ``token`` was issued to a guest (meaningful only for a token that is known)."""
    return token.startswith(GUEST_TOKEN_PREFIX)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def new_device_id() -> str:
    """Ten capital letters, as Synapse makes them."""
    return "".join(secrets.choice(_DEVICE_ALPHABET) for _ in range(10))
