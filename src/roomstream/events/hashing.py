"""Content hashes, reference hashes and event IDs (room versions 1 to 12).

* Content hash: SHA-256 over the canonical JSON of the *whole* event without
  ``unsigned``, ``signatures`` and ``hashes``. Stored, unpadded standard base64, in
  ``hashes.sha256``. It protects the parts of the event that redaction removes.
* Reference hash: SHA-256 over the canonical JSON of the *redacted* event without
  ``signatures``, ``unsigned`` and ``age_ts``. It covers ``hashes``, so it transitively
  covers the full content too.
* Event ID: room versions 4 and later ``$`` + URL-safe unpadded base64 of the
  reference hash (43 characters after the ``$``); room version 3 the same in standard
  base64 (``+`` and ``/``); room versions 1 and 2 the PDU's own ``event_id`` field
  (``$opaque_id:server_name``, chosen by the sending server).
* Room ID in room version 12: ``!`` + the create event's ID without its ``$``.

All of these depend only on the JSON *values*, never on how the bytes were formatted.
Hashes are taken with ``encode_canonical_json_fast(strict=False)``: the values of room
versions 1 to 5 may hold floats and big integers, and for every other value the bytes are
the strict encoding's (the strict rules are enforced where events are parsed or built).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

from roomstream.events.canonical import encode_canonical_json_fast
from roomstream.events.redaction import redact
from roomstream.events.room_versions import EventIdFormat, RoomVersion

_CONTENT_HASH_EXCLUDED = frozenset({"unsigned", "signatures", "hashes"})
_REFERENCE_HASH_EXCLUDED = frozenset({"signatures", "unsigned", "age_ts"})


def encode_base64(data: bytes) -> str:
    """Unpadded standard base64 (the Matrix default for binary values)."""
    return base64.b64encode(data).rstrip(b"=").decode("ascii")


def encode_base64_urlsafe(data: bytes) -> str:
    """Unpadded URL-safe base64 (``-`` and ``_`` instead of ``+`` and ``/``)."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def decode_base64(text: str) -> bytes:
    """Decode standard or URL-safe base64, padded or not; ``ValueError`` if malformed."""
    if not text.isascii():
        raise ValueError("base64 text must be ASCII")
    stripped = text.rstrip("=")
    if len(stripped) % 4 == 1:
        raise ValueError("impossible base64 length")
    translated = stripped.replace("-", "+").replace("_", "/")
    return base64.b64decode(translated + "=" * (-len(translated) % 4), validate=True)


def compute_content_hash(event_dict: Mapping[str, Any]) -> bytes:
    """SHA-256 digest of the event without ``unsigned``, ``signatures`` and ``hashes``."""
    stripped = {k: v for k, v in event_dict.items() if k not in _CONTENT_HASH_EXCLUDED}
    return hashlib.sha256(encode_canonical_json_fast(stripped, strict=False)).digest()


def add_content_hash(event_dict: dict[str, Any]) -> dict[str, Any]:
    """Set ``hashes.sha256`` on ``event_dict`` (in place) and return it.

    Other algorithms already present in ``hashes`` are kept; ``sha256`` is replaced.
    """
    digest = compute_content_hash(event_dict)
    existing = event_dict.get("hashes")
    hashes = dict(existing) if isinstance(existing, Mapping) else {}
    hashes["sha256"] = encode_base64(digest)
    event_dict["hashes"] = hashes
    return event_dict


def check_content_hash(event_dict: Mapping[str, Any]) -> bool:
    """True if ``hashes.sha256`` is present, decodable and matches the content hash."""
    hashes = event_dict.get("hashes")
    if not isinstance(hashes, Mapping):
        return False
    claimed = hashes.get("sha256")
    if not isinstance(claimed, str):
        return False
    try:
        claimed_bytes = decode_base64(claimed)
    except ValueError:
        return False
    return hmac.compare_digest(claimed_bytes, compute_content_hash(event_dict))


def reference_hash_preimage(event_dict: Mapping[str, Any], room_version: RoomVersion) -> bytes:
    """The canonical JSON bytes the reference hash is taken over.

    These are also exactly the bytes an event signature covers (the redacted event
    without ``signatures``/``unsigned``), which lets tests check one against the other.
    """
    redacted = redact(event_dict, room_version)
    stripped = {k: v for k, v in redacted.items() if k not in _REFERENCE_HASH_EXCLUDED}
    return encode_canonical_json_fast(stripped, strict=False)


def compute_reference_hash(event_dict: Mapping[str, Any], room_version: RoomVersion) -> bytes:
    """SHA-256 digest of the redacted event without ``signatures``/``unsigned``/``age_ts``."""
    return hashlib.sha256(reference_hash_preimage(event_dict, room_version)).digest()


def compute_event_id(event_dict: Mapping[str, Any], room_version: RoomVersion) -> str:
    """The event's ID under ``room_version``'s event ID format.

    v4+: ``$`` + URL-safe unpadded base64 of the reference hash; v3: standard base64.
    Redaction keeps a top-level ``event_id`` key, so one present in the dict is hashed
    too; events in these room versions must not carry one over federation.

    v1, v2: the ``event_id`` the PDU carries (``ValueError`` if it has no string one;
    :func:`format.validate_pdu_fields` checks its grammar).
    """
    version_format = room_version.event_id_format
    if version_format is EventIdFormat.SERVER_PART:
        event_id = event_dict.get("event_id")
        if not isinstance(event_id, str):
            raise ValueError(
                f"events of room version {room_version.identifier} carry their 'event_id'"
            )
        return event_id
    digest = compute_reference_hash(event_dict, room_version)
    if version_format is EventIdFormat.BASE64:
        return "$" + encode_base64(digest)
    return "$" + encode_base64_urlsafe(digest)


def room_id_from_create_event_id(create_event_id: str) -> str:
    """Room version 12: the room ID is the create event's ID with ``!`` in place of ``$``."""
    if not create_event_id.startswith("$") or len(create_event_id) < 2:
        raise ValueError(f"not an event ID: {create_event_id!r}")
    return "!" + create_event_id[1:]
