"""Password hashing with argon2id (argon2-cffi), off the event loop.

A hash is slow on purpose (tens of milliseconds): it runs on a worker thread so the loop
keeps serving other requests meanwhile.
"""

from __future__ import annotations

import asyncio

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

__all__ = ["hash_password", "verify_password"]

_HASHER = PasswordHasher()


async def hash_password(password: str) -> str:
    """An argon2id hash (with its own random salt and parameters) of ``password``."""
    return await asyncio.to_thread(_HASHER.hash, password)


async def verify_password(stored_hash: str, password: str) -> bool:
    """Whether ``password`` matches ``stored_hash``; False for a malformed hash."""

    def check() -> bool:
        try:
            return _HASHER.verify(stored_hash, password)
        except (VerificationError, InvalidHashError):
            return False

    return await asyncio.to_thread(check)
