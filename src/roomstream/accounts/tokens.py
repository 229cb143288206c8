"""Access tokens and device IDs: random, and tokens stored only as their SHA-256.

A token carries 256 random bits, so a plain SHA-256 (no salt, no slow hash) is enough to
make the stored value useless to someone who reads the database, and lets a request's
token be found with one indexed lookup.
"""

from __future__ import annotations

import hashlib
import secrets
import string

__all__ = ["new_access_token", "new_device_id", "token_hash"]

TOKEN_PREFIX = "rst_"
_DEVICE_ALPHABET = string.ascii_uppercase


def new_access_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def new_device_id() -> str:
    """Ten capital letters, as Synapse makes them."""
    return "".join(secrets.choice(_DEVICE_ALPHABET) for _ in range(10))
