"""The key-backup rule: when an uploaded session key replaces the backed-up one.

Spec (server-side key backup): a verified key beats an unverified one; among equally
verified keys the lower ``first_message_index`` wins (it decrypts more of the session);
then the lower ``forwarded_count`` (fewer hops). A key that is not strictly better leaves
the stored one in place, so re-uploading the same key changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SessionQuality", "replaces"]


@dataclass(frozen=True, slots=True)
class SessionQuality:
    is_verified: bool
    first_message_index: int
    forwarded_count: int

    def rank(self) -> tuple[bool, int, int]:
        """Smaller is better."""
        return (not self.is_verified, self.first_message_index, self.forwarded_count)


def replaces(new: SessionQuality, stored: SessionQuality | None) -> bool:
    """Whether ``new`` takes the place of ``stored`` (None: nothing stored yet)."""
    return stored is None or new.rank() < stored.rank()
