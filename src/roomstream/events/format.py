"""Turning bytes into trusted-format events, and local event dicts into signed events.

Received events (:func:`parse_pdu`), in this order, each failure a ``BadEventError``:

1. more than :data:`MAX_RAW_PDU_BYTES` bytes as received            -> ``M_TOO_LARGE``
2. strict JSON decoding (:func:`canonical.decode_json_object`)      -> ``M_NOT_JSON`` /
   ``M_BAD_JSON``
3. canonical JSON of the whole PDU (signatures and ``unsigned`` included, as the spec's
   size limit says) longer than :data:`MAX_PDU_SIZE` bytes          -> ``M_TOO_LARGE``
4. required keys and their types, identifier grammar, 255-byte key limits, ``redacts``
   placement, no top-level ``event_id`` from v3 (v1, v2: a ``$opaque:server`` one, and
   ``prev_events``/``auth_events`` as ``[event_id, hashes]`` pairs); in v12 no
   ``room_id`` on the create event and the create event not in ``auth_events``
   (:func:`validate_pdu_fields`) -> ``M_BAD_JSON``
   (``type``/``sender``/``room_id``/``state_key`` over 255 bytes     -> ``M_TOO_LARGE``)
5. content hash mismatch                  -> :class:`ContentHashMismatchError` (``M_BAD_JSON``)
6. computed event ID differs from ``expected_event_id``              -> ``M_BAD_JSON``

In room versions 1 to 5 (``strict_canonical_json`` false) step 2 admits floats and
integers of any size, as those versions allow. Nothing else is raised for any input
bytes. Signatures are *not* checked here (that needs the senders' keys; see
:func:`signing.check_event_signatures`), nor are auth rules.

On a content hash mismatch the spec tells a receiver to keep the event but use its
redacted form (the sender may legitimately have served a redacted copy, e.g. via
backfill). We raise by default so that a mismatch is never silently accepted, and the
raised :class:`ContentHashMismatchError` carries the redacted event (same event ID) for
callers that implement the spec's fallback after checking signatures.

Local events: :func:`build_event_dict` lays out the unsigned PDU for a room version and
:func:`finalise_local_event` validates it, adds the content hash, signs it, serialises it
as canonical JSON (which becomes ``Event.raw``) and computes the event ID.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from roomstream.errors import BadEventError, EventTooLargeError, MalformedEventError
from roomstream.events.canonical import (
    check_json_value,
    decode_json_object,
    encode_canonical_json_fast,
)
from roomstream.events.hashing import (
    add_content_hash,
    check_content_hash,
    compute_event_id,
    compute_reference_hash,
    encode_base64,
    room_id_from_create_event_id,
)
from roomstream.events.model import Event
from roomstream.events.redaction import redact
from roomstream.events.room_versions import RoomVersion
from roomstream.events.signing import SigningKey, sign_event
from roomstream.events.types import EventTypes
from roomstream.grammar import (
    MAX_ID_BYTES,
    is_event_id,
    is_event_id_with_server,
    is_pdu_sender,
    is_room_id_for_version,
    utf8_length,
)

#: The spec's limit on a whole PDU, measured as canonical JSON including signatures.
MAX_PDU_SIZE = 65536
#: Received bytes beyond this are refused before parsing. Canonical JSON is never longer
#: than any other encoding of the same value, so this only refuses PDUs padded with more
#: than 15x their own size in whitespace or escapes, while bounding the work per PDU.
MAX_RAW_PDU_BYTES = 16 * MAX_PDU_SIZE
#: Limit on ``type``, ``sender``, ``room_id``, ``state_key`` and IDs, in UTF-8 bytes.
MAX_KEY_BYTES = MAX_ID_BYTES


class ContentHashMismatchError(MalformedEventError):
    """The event's ``hashes.sha256`` does not match its content.

    ``redacted_event`` is the event as the spec says a receiver should use it instead:
    the redacted form (same event ID; ``raw`` is its canonical JSON, not the received
    bytes). Only use it after the signatures have been checked.
    """

    def __init__(self, message: str, redacted_event: Event) -> None:
        super().__init__(message)
        self.redacted_event = redacted_event


def _bad(message: str) -> BadEventError:
    return MalformedEventError(message)


def _check_length(name: str, value: str) -> None:
    if utf8_length(value) > MAX_KEY_BYTES:
        raise EventTooLargeError(f"'{name}' is longer than {MAX_KEY_BYTES} bytes")


def _check_lenient_length(name: str, value: str, room_version: RoomVersion, local: bool) -> None:
    """``type`` and ``state_key``: before room version 11 only over 255 code points is
    malformed (the auth rules reject what is over 255 bytes); from v11, and for events
    made here (which must never be built only to be rejected), over 255 bytes."""
    if room_version.strict_event_byte_limits or local:
        _check_length(name, value)
    elif len(value) > MAX_KEY_BYTES:
        raise EventTooLargeError(f"'{name}' is longer than {MAX_KEY_BYTES} code points")


def _check_event_id_list(data: Mapping[str, Any], key: str, room_version: RoomVersion) -> None:
    value = data.get(key)
    if type(value) is not list:
        raise _bad(f"'{key}' must be an array of event IDs")
    if room_version.event_ids_in_pdu:
        # v1, v2: [event_id, {"sha256": reference hash}] pairs. The hashes are not checked
        # (nobody does: the referenced event is checked against its own ID when fetched).
        for item in value:
            if (
                type(item) is not list
                or len(item) != 2
                or not is_event_id(item[0])
                or type(item[1]) is not dict
            ):
                raise _bad(
                    f"'{key}' must contain [event ID, hashes] pairs in room version "
                    f"{room_version.identifier}, found {str(item)[:80]!r}"
                )
        return
    for item in value:
        if not is_event_id(item):
            raise _bad(f"'{key}' must contain only event IDs, found {str(item)[:80]!r}")


def validate_pdu_fields(
    data: Mapping[str, Any], room_version: RoomVersion, *, local: bool = False
) -> None:
    """Check the PDU's required keys, their types and identifier grammar for the version.

    With ``local=True`` (events being created here) ``hashes`` and ``signatures`` may be
    absent because :func:`finalise_local_event` adds them.
    """
    if room_version.event_ids_in_pdu:
        # v1, v2: the sending server chose the ID; its server part must sign the event.
        event_id = data.get("event_id")
        if type(event_id) is not str or not is_event_id_with_server(event_id):
            raise _bad(
                f"events in room version {room_version.identifier} must carry an 'event_id'"
                " of the form $opaque_id:server_name"
            )
        _check_length("event_id", event_id)
    elif "event_id" in data:
        # Room versions 3 and later derive the ID from the reference hash; a received
        # ``event_id`` key would otherwise be served to clients as if it were the ID.
        raise _bad(
            f"events in room version {room_version.identifier} must not carry an 'event_id' key"
        )
    event_type = data.get("type")
    if type(event_type) is not str:
        raise _bad("'type' must be a string")
    _check_lenient_length("type", event_type, room_version, local)

    sender = data.get("sender")
    if type(sender) is not str:
        raise _bad("'sender' must be a string")
    _check_length("sender", sender)
    if not is_pdu_sender(sender):
        raise _bad(f"'sender' is not a valid user ID: {sender[:80]!r}")

    is_v12_create = room_version.room_id_from_create_event and event_type == EventTypes.CREATE
    room_id = data.get("room_id")
    if is_v12_create:
        # The v12 create event has no room_id: its ID names the room. One that carries
        # one is malformed for the version (as Synapse refuses it), not merely rejected.
        if "room_id" in data:
            raise _bad(
                f"m.room.create events in room version {room_version.identifier}"
                " must not have a 'room_id'"
            )
    else:
        if type(room_id) is not str:
            raise _bad("'room_id' must be a string")
        _check_length("room_id", room_id)
        if not is_room_id_for_version(
            room_id, from_create_event=room_version.room_id_from_create_event
        ):
            raise _bad(f"'room_id' is not a valid room ID for this room version: {room_id[:80]!r}")

    if "state_key" in data:
        state_key = data["state_key"]
        if type(state_key) is not str:
            raise _bad("'state_key' must be a string when present")
        _check_lenient_length("state_key", state_key, room_version, local)

    content = data.get("content")
    if type(content) is not dict:
        raise _bad("'content' must be an object")

    depth = data.get("depth")
    if type(depth) is not int or depth < 0:
        raise _bad("'depth' must be a non-negative integer")
    if type(data.get("origin_server_ts")) is not int:
        raise _bad("'origin_server_ts' must be an integer")

    _check_event_id_list(data, "prev_events", room_version)
    _check_event_id_list(data, "auth_events", room_version)
    if room_version.room_id_from_create_event and isinstance(room_id, str):
        # v12: the room ID names the create event, which auth_events must not list.
        create_event_id = "$" + room_id[1:]
        if create_event_id in data["auth_events"]:
            raise _bad(
                f"'auth_events' must not list the m.room.create event {create_event_id}"
                f" in room version {room_version.identifier}"
            )

    if "hashes" in data or not local:
        hashes = data.get("hashes")
        if type(hashes) is not dict or type(hashes.get("sha256")) is not str:
            raise _bad("'hashes' must be an object with a 'sha256' string")
    if "signatures" in data or not local:
        signatures = data.get("signatures")
        if type(signatures) is not dict or not all(
            type(by_server) is dict and all(type(sig) is str for sig in by_server.values())
            for by_server in signatures.values()
        ):
            raise _bad("'signatures' must map server names to objects of key ID -> string")

    if event_type == EventTypes.REDACTION:
        # v11 moved 'redacts' into content (MSC2174); a top-level one is then meaningless.
        if room_version.updated_redaction_rules:
            if not is_event_id(content.get("redacts")):
                raise _bad("redaction events must have an event ID in 'content.redacts'")
        elif not is_event_id(data.get("redacts")):
            raise _bad("redaction events must have an event ID in top-level 'redacts'")


def parse_pdu(
    raw: bytes, room_version: RoomVersion, *, expected_event_id: str | None = None
) -> Event:
    """Parse and validate a received PDU; see the module docstring for the checks.

    Invariants of the returned event: ``raw`` is the input bytes, unchanged; ``data`` is
    their strict parse; ``event_id`` is computed from the reference hash (never taken
    from the input); the content hash matched.
    """
    raw = bytes(raw)
    if len(raw) > MAX_RAW_PDU_BYTES:
        raise EventTooLargeError(f"PDU is larger than {MAX_PDU_SIZE} bytes")
    strict = room_version.strict_canonical_json
    data = decode_json_object(raw, strict=strict)
    # Canonical JSON is never longer than the received encoding, so only long inputs
    # need re-encoding to measure.
    if (
        len(raw) > MAX_PDU_SIZE
        and len(encode_canonical_json_fast(data, strict=strict)) > MAX_PDU_SIZE
    ):
        raise EventTooLargeError(f"PDU is larger than {MAX_PDU_SIZE} bytes")
    validate_pdu_fields(data, room_version)

    event_id = compute_event_id(data, room_version)
    if not check_content_hash(data):
        redacted = redact(data, room_version)
        redacted_event = Event(
            redacted, room_version, event_id, encode_canonical_json_fast(redacted, strict=strict)
        )
        raise ContentHashMismatchError(
            f"content hash of {event_id} does not match its content", redacted_event
        )
    if expected_event_id is not None and event_id != expected_event_id:
        raise _bad(f"event ID mismatch: expected {expected_event_id[:80]!r}, computed {event_id}")
    return Event(data, room_version, event_id, raw)


def build_event_dict(
    room_version: RoomVersion,
    *,
    event_type: str,
    sender: str,
    content: Mapping[str, Any],
    prev_events: Sequence[str | Sequence[Any]],
    auth_events: Sequence[str | Sequence[Any]],
    depth: int,
    room_id: str | None = None,
    state_key: str | None = None,
    redacts: str | None = None,
    origin_server_ts: int | None = None,
    unsigned: Mapping[str, Any] | None = None,
    reference_hashes: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Lay out an unsigned, unhashed PDU dict for ``room_version``.

    Room versions 1 and 2 name prev and auth events as ``[event_id, {"sha256": hash}]``
    pairs: ``reference_hashes`` maps event IDs to their unpadded base64 reference hashes
    (:func:`reference_hash_of`); an ID it lacks gets ``{}`` (receivers do not check these
    hashes), and a reference given as a pair already (as a ``make_join`` template lists
    them) is kept. Their ``event_id`` is added by :func:`finalise_local_event`. In v3+
    references are event IDs.

    ``room_id`` must be given except for a v12 ``m.room.create`` event, where it must not
    be (the room ID is derived from the create event's ID afterwards, see
    :func:`room_id_for_create_event`). ``redacts`` goes top-level in v10 and into
    ``content`` from v11. ``origin_server_ts`` defaults to now.
    """
    is_v12_create = room_version.room_id_from_create_event and event_type == EventTypes.CREATE
    if is_v12_create and room_id is not None:
        raise ValueError("room version 12 create events must not have a room_id")
    if not is_v12_create and room_id is None:
        raise ValueError("room_id is required")
    event: dict[str, Any] = {
        "type": event_type,
        "sender": sender,
        "content": dict(content),
        "prev_events": _event_references(prev_events, room_version, reference_hashes),
        "auth_events": _event_references(auth_events, room_version, reference_hashes),
        "depth": depth,
        "origin_server_ts": (
            int(time.time() * 1000) if origin_server_ts is None else origin_server_ts
        ),
    }
    if room_id is not None:
        event["room_id"] = room_id
    if state_key is not None:
        event["state_key"] = state_key
    if redacts is not None:
        if room_version.updated_redaction_rules:
            event["content"]["redacts"] = redacts
        else:
            event["redacts"] = redacts
    if unsigned:
        event["unsigned"] = dict(unsigned)
    return event


def _event_references(
    references: Sequence[str | Sequence[Any]],
    room_version: RoomVersion,
    hashes: Mapping[str, str] | None,
) -> list[Any]:
    """The ``prev_events``/``auth_events`` value: the IDs (v3+), or v1/v2 pairs. A v1/v2
    reference already given as a pair (a ``make_join`` template's) is kept as it is."""
    if not room_version.event_ids_in_pdu:
        return list(references)
    known = hashes or {}
    return [
        [r, {"sha256": known[r]} if r in known else {}] if isinstance(r, str) else list(r)
        for r in references
    ]


def reference_hash_of(event: Event) -> str:
    """An event's reference hash as room versions 1 and 2 cite it (unpadded base64)."""
    return encode_base64(compute_reference_hash(event.data, event.room_version))


def new_event_id(server_name: str) -> str:
    """A fresh event ID for room versions 1 and 2: ``$`` + 24 random URL-safe characters
    + ``:server_name`` (unguessable, so never reused)."""
    return f"${secrets.token_urlsafe(18)}:{server_name}"


def finalise_local_event(
    event_dict: Mapping[str, Any],
    room_version: RoomVersion,
    server_name: str,
    signing_key: SigningKey,
) -> Event:
    """Hash, sign and serialise a locally created event; the input is not modified.

    Raises ``BadEventError`` if the dict is not a valid PDU (e.g. content with floats in
    a version with strict canonical JSON) or ends up larger than :data:`MAX_PDU_SIZE`.
    Existing signatures (e.g. from a resident server during a restricted join) are kept.
    Room versions 1 and 2: the event gets a fresh ``event_id`` on ``server_name`` (before
    hashing, as the content hash covers it) unless it already has one on that server; an
    ID on another server (a ``make_join`` template's) is replaced, as Synapse does, since
    the server of the ID must sign the event.
    """
    data = dict(event_dict)
    strict = room_version.strict_canonical_json
    if room_version.event_ids_in_pdu:
        existing = data.get("event_id")
        if not (isinstance(existing, str) and existing.endswith(":" + server_name)):
            data["event_id"] = new_event_id(server_name)
    check_json_value(data, local=True, strict=strict)
    validate_pdu_fields(data, room_version, local=True)
    add_content_hash(data)
    sign_event(data, server_name, signing_key, room_version=room_version)
    raw = encode_canonical_json_fast(data, strict=strict)
    if len(raw) > MAX_PDU_SIZE:
        raise EventTooLargeError(f"event is larger than {MAX_PDU_SIZE} bytes")
    # Re-parse so that data is exactly raw parsed (tuples become lists, nothing is
    # shared with the caller's dicts).
    # (orjson cannot hold integers beyond 64 bits, which v1-v5 events may have.)
    parsed: dict[str, Any] = orjson.loads(raw) if strict else decode_json_object(raw, strict=False)
    return Event(parsed, room_version, compute_event_id(parsed, room_version), raw)


def room_id_for_create_event(create_event: Event) -> str:
    """The room ID a create event establishes: derived from its ID in v12, else its field."""
    if create_event.room_version.room_id_from_create_event:
        return room_id_from_create_event_id(create_event.event_id)
    return create_event.room_id
