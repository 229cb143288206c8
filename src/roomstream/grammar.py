"""Every Matrix identifier grammar, in one place, derived from the spec's text.

Each pattern below is built from the rules of the specification's appendix "Identifier
Grammar", quoted next to the code that implements them (as h11's ``_abnf.py`` does for
the HTTP RFCs), so a reader can check one against the other. Nothing else in roomstream
spells out what a user ID, room ID, event ID, room alias or server name looks like: it
calls one of the functions here.

Two sides, named apart (the spec's robustness principle, made explicit):

- **What this server produces** is held to the current grammar:
  :func:`is_new_user_localpart` / :func:`is_new_user_id` for the accounts it creates.
- **What this server receives** is held to what the spec says a receiver MUST accept,
  which is wider: :func:`is_user_id` (the spec's *historical* user IDs: any printable
  ASCII localpart), :func:`is_room_id`, :func:`is_event_id`, :func:`is_room_alias`. And
  one wider still, :func:`is_pdu_sender`: Synapse accepts (and has stored for years)
  events whose ``sender`` localpart is any Unicode other than ``:`` and NUL, even empty;
  refusing such an event would split a room from the servers that accepted it.

Lengths are UTF-8 bytes everywhere (the spec's PDU size limits count bytes), never
characters. The grammars are compiled regular expressions: the power-levels check runs
:func:`is_user_id` on every key of every power-levels event a state merge replays, and a
character-by-character loop made that most of a merge's CPU (3.0 s against 1.1 s for a
1,500-user room).

Only the standard library; this module is at the bottom of the layers.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = [
    "MAX_ID_BYTES",
    "is_event_id",
    "is_hashed_event_id",
    "is_new_user_id",
    "is_new_user_localpart",
    "is_opaque_id",
    "is_pdu_sender",
    "is_room_alias",
    "is_room_id",
    "is_room_id_for_version",
    "is_room_id_to_look_up",
    "is_server_name",
    "is_user_id",
    "split_user_id",
    "utf8_length",
]

#: "The length of a user ID, including the @ sigil and the domain, MUST NOT exceed 255
#: bytes" -- and the same for room IDs, event IDs and room aliases (and the PDU keys
#: ``type``, ``sender``, ``room_id``, ``state_key``).
MAX_ID_BYTES: Final = 255


def utf8_length(value: str) -> int:
    """``len(value.encode("utf-8"))``, without encoding strings too short to matter.

    A character is at most 4 UTF-8 bytes, so a string of at most 63 characters is within
    :data:`MAX_ID_BYTES` whatever it holds; only its upper bound is returned then. Use
    only to compare against :data:`MAX_ID_BYTES`.
    """
    n = len(value) * 4
    return n if n <= MAX_ID_BYTES else len(value.encode("utf-8"))


# --------------------------------------------------------------------------------------
# Server names
#
#     server_name = hostname [ ":" port ]
#     port        = 1*5DIGIT
#     hostname    = IPv4address / "[" IPv6address "]" / dns-name
#     IPv4address = 1*3DIGIT "." 1*3DIGIT "." 1*3DIGIT "." 1*3DIGIT
#     IPv6address = 2*45IPv6char
#     IPv6char    = DIGIT / %x41-46 / %x61-66 / ":" / "."
#                       ; 0-9, A-F, a-f, :, .
#     dns-name    = 1*255dns-char
#     dns-char    = DIGIT / ALPHA / "-" / "."
#
# Every IPv4address is also a dns-name (digits and dots), so the alternative adds nothing
# to what matches and is left out of the pattern.
# --------------------------------------------------------------------------------------

_PORT: Final = r"[0-9]{1,5}"
_IPV6_ADDRESS: Final = r"[0-9A-Fa-f:.]{2,45}"
_DNS_NAME: Final = r"[0-9A-Za-z.\-]{1,255}"
_HOSTNAME: Final = rf"(?:\[{_IPV6_ADDRESS}\]|{_DNS_NAME})"
_SERVER_NAME: Final = rf"{_HOSTNAME}(?::{_PORT})?"

_SERVER_NAME_RE: Final = re.compile(_SERVER_NAME)


def is_server_name(value: str) -> bool:
    """Whether ``value`` matches ``server_name`` above."""
    return _SERVER_NAME_RE.fullmatch(value) is not None


# --------------------------------------------------------------------------------------
# User IDs: ``@localpart:server_name``
#
#     user_id_localpart = 1*user_id_char
#     user_id_char = DIGIT
#                  / %x61-7A                   ; a-z
#                  / "-" / "." / "=" / "_" / "/" / "+"
#
# Historical user IDs: "Older versions of this specification were more tolerant of the
# characters permitted in user ID localparts. [...] servers MUST accept user IDs with
# localparts from the expanded character set:"
#
#     extended_user_id_char = %x21-39 / %x3B-7E  ; all ASCII printing chars except :
#
# "[...] servers MUST NOT create user IDs that do not conform to the grammar above", and
# "The length of a user ID, including the @ sigil and the domain, MUST NOT exceed 255
# bytes." A user ID is split at its first ":" (a localpart has none, a server name may).
# --------------------------------------------------------------------------------------

_USER_ID_CHAR: Final = r"[0-9a-z\-.=_/+]"
_EXTENDED_USER_ID_CHAR: Final = r"[\x21-\x39\x3b-\x7e]"

_NEW_LOCALPART_RE: Final = re.compile(rf"{_USER_ID_CHAR}+")
_NEW_USER_ID_RE: Final = re.compile(rf"@{_USER_ID_CHAR}+:{_SERVER_NAME}")
_USER_ID_RE: Final = re.compile(rf"@({_EXTENDED_USER_ID_CHAR}+):({_SERVER_NAME})")
# Not the spec's: see is_pdu_sender.
_PDU_SENDER_RE: Final = re.compile(rf"@[^:\x00]*:{_SERVER_NAME}")


def is_new_user_localpart(localpart: str) -> bool:
    """Produced: whether this server may create an account with ``localpart``
    (``1*user_id_char``)."""
    return _NEW_LOCALPART_RE.fullmatch(localpart) is not None


def is_new_user_id(user_id: str) -> bool:
    """Produced: whether ``user_id`` is one this server may create (current grammar, at
    most 255 bytes)."""
    # A match is ASCII, so its length in characters is its length in bytes.
    return len(user_id) <= MAX_ID_BYTES and _NEW_USER_ID_RE.fullmatch(user_id) is not None


def is_user_id(value: object) -> bool:
    """Received: whether ``value`` is a user ID a server MUST accept (historical
    grammar: printable ASCII localpart, at least one character; at most 255 bytes).

    For every user ID that names a user rather than carries an event: power-levels
    keys, invite and membership targets, user IDs in requests. Takes any object so
    that JSON values can be checked as they come.
    """
    # A match is ASCII, so its length in characters is its length in bytes.
    return (
        isinstance(value, str)
        and len(value) <= MAX_ID_BYTES
        and _USER_ID_RE.fullmatch(value) is not None
    )


def split_user_id(value: str) -> tuple[str, str] | None:
    """``(localpart, server_name)`` of a user ID as :func:`is_user_id` accepts it;
    ``None`` for anything else."""
    if len(value) > MAX_ID_BYTES:
        return None
    match = _USER_ID_RE.fullmatch(value)
    return None if match is None else (match.group(1), match.group(2))


def is_pdu_sender(value: str) -> bool:
    """Received, lenient: whether ``value`` may be the ``sender`` of a PDU we accept.

    Wider than the spec: the localpart may be any Unicode other than ``:`` and NUL, and
    may be empty. Synapse accepts these on the wire, so events sent by such users exist
    in rooms that other servers share with us; refusing them would split those rooms.
    Only the server name is held to its grammar. At most 255 UTF-8 bytes. Also what a
    filter's ``senders`` may name, since it matches those senders.
    """
    return utf8_length(value) <= MAX_ID_BYTES and _PDU_SENDER_RE.fullmatch(value) is not None


# --------------------------------------------------------------------------------------
# Room IDs
#
# Before room version 12: ``!opaque_id:server_name``. "The opaque_id [...] may contain
# any valid non-surrogate Unicode code points [...] except : and NUL". An empty opaque_id
# is accepted, as it always has been here: it harms nothing (the ID is opaque), and a
# room whose ID has one would otherwise become unreadable.
#
# Room version 12: "the room ID is the event ID of the create event with the $ sigil
# replaced by !": ``!`` followed by the create event's reference hash in URL-safe
# unpadded base64, which is 43 characters from ``A-Z a-z 0-9 - _``.
#
# At most 255 bytes in both forms.
# --------------------------------------------------------------------------------------

_URLSAFE_HASH: Final = r"[A-Za-z0-9_\-]{43}"
_STANDARD_HASH: Final = r"[A-Za-z0-9+/]{43}"

_ROOM_ID_WITH_SERVER_RE: Final = re.compile(rf"![^:\x00]*:{_SERVER_NAME}")
_ROOM_ID_FROM_CREATE_RE: Final = re.compile(rf"!{_URLSAFE_HASH}")


def is_room_id_for_version(value: str, *, from_create_event: bool) -> bool:
    """Received: whether ``value`` is a room ID of a room version whose room IDs are
    ``!`` + the create event's hash (``from_create_event``, v12) or else
    ``!opaque_id:server_name``."""
    if from_create_event:
        return _ROOM_ID_FROM_CREATE_RE.fullmatch(value) is not None
    return (
        utf8_length(value) <= MAX_ID_BYTES and _ROOM_ID_WITH_SERVER_RE.fullmatch(value) is not None
    )


def is_room_id(value: str) -> bool:
    """Received: whether ``value`` is a room ID of some room version (either form); for
    requests, which name rooms without saying their version."""
    return is_room_id_for_version(value, from_create_event=False) or is_room_id_for_version(
        value, from_create_event=True
    )


def is_room_id_to_look_up(value: str) -> bool:
    """Received from clients, lenient: whether ``value`` may name a room in a request
    (``!`` and 1 to 254 more bytes, no NUL: PostgreSQL text cannot hold one).

    A request's room ID is only ever looked up, never stored by itself: one that is not
    well formed names no room, so the request answers ``404 M_NOT_FOUND`` as for any
    unknown room (Synapse does the same) rather than ``400``.
    """
    return (
        len(value) > 1
        and value.startswith("!")
        and utf8_length(value) <= MAX_ID_BYTES
        and "\0" not in value
    )


# --------------------------------------------------------------------------------------
# Event IDs
#
# Room versions 1 and 2: ``$opaque_id:server_name``. Version 3: ``$`` + the reference
# hash in standard unpadded base64 (``A-Z a-z 0-9 + /``, 43 characters). Versions 4 and
# later: the same in URL-safe unpadded base64 (``A-Z a-z 0-9 - _``). At most 255 bytes.
# --------------------------------------------------------------------------------------

_HASHED_EVENT_ID_RES: Final = {
    True: re.compile(rf"\${_URLSAFE_HASH}"),
    False: re.compile(rf"\${_STANDARD_HASH}"),
}


def is_hashed_event_id(value: str, *, url_safe: bool) -> bool:
    """Whether ``value`` is an event ID of room version 4 or later (``url_safe``) or of
    version 3: ``$`` + 43 unpadded base64 characters."""
    return _HASHED_EVENT_ID_RES[url_safe].fullmatch(value) is not None


_EVENT_ID_WITH_SERVER_RE: Final = re.compile(rf"\$[^:\x00]+:{_SERVER_NAME}")


def is_event_id_with_server(value: str) -> bool:
    """Whether ``value`` is an event ID of room versions 1 and 2: ``$opaque_id:server_name``
    (the opaque part any characters but ``:`` and NUL, at most 255 bytes in all). The
    server part is the server that must have signed the event."""
    return (
        utf8_length(value) <= MAX_ID_BYTES and _EVENT_ID_WITH_SERVER_RE.fullmatch(value) is not None
    )


def is_event_id(value: object) -> bool:
    """Received, lenient: whether ``value`` may be an event ID referenced by an event
    (``prev_events``, ``auth_events``, ``redacts``): ``$`` and at most 255 bytes.

    Lenient on purpose: which of the forms above applies depends on the room version of
    the *referenced* event, an unknown reference is dealt with when it is fetched, and
    refusing the whole event here would be a stricter rule than other servers apply.
    """
    return isinstance(value, str) and value.startswith("$") and utf8_length(value) <= MAX_ID_BYTES


# --------------------------------------------------------------------------------------
# Room aliases: ``#room_alias_localpart:server_name``
#
# "The room_alias_localpart may contain any valid non-surrogate Unicode code points
# except : and NUL." At most 255 bytes. An empty localpart is refused: an alias is
# chosen by a person, and ``#:server`` names nothing.
# --------------------------------------------------------------------------------------

_ROOM_ALIAS_RE: Final = re.compile(rf"#[^:\x00]+:{_SERVER_NAME}")


def is_room_alias(value: str) -> bool:
    """Received and produced: whether ``value`` is a room alias."""
    return utf8_length(value) <= MAX_ID_BYTES and _ROOM_ALIAS_RE.fullmatch(value) is not None


# --------------------------------------------------------------------------------------
# Opaque identifiers
#
# Device IDs, event types, transaction IDs: the spec gives them no grammar (they are
# "opaque"); what we store must still fit its columns and PostgreSQL's text type.
# --------------------------------------------------------------------------------------


def is_opaque_id(value: str) -> bool:
    """Whether ``value`` is an opaque identifier we can store: 1 to 255 bytes, none of
    them a control character (NUL, for one, is refused by PostgreSQL text columns)."""
    return value != "" and utf8_length(value) <= MAX_ID_BYTES and value.isprintable()
