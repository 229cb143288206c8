"""The server's ed25519 signing key and event signatures.

Key storage: one file per server name in the data directory,
``<data_dir>/<server_name>.signing.key``, in the one-line format Synapse and
``signedjson.key.write_signing_keys`` use: ``ed25519 <version> <unpadded base64 seed>``.
The key ID is ``ed25519:<version>`` with ``version = "a_" + 4 random alphanumerics``.

Invariants of :func:`load_or_create_signing_key`:

* the file is created with mode ``0600`` (the data directory with ``0700`` if it is new);
* it is never visible half-written: the key is written and fsynced under a temporary name
  and then hard-linked into place, which fails instead of overwriting if another process
  won the race (in which case that process's key is loaded and used);
* an existing file that cannot be parsed is an error, never silently replaced: replacing
  a server's key is an operator decision.

Event signatures (server-server API, "Signing events") are computed over the *redacted*
event without ``signatures`` and ``unsigned``, so they stay valid when an event is
redacted; the content hash in ``hashes`` (which redaction keeps) ties them to the full
content.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
import string
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from signedjson.key import (
    NACL_ED25519,
    decode_verify_key_bytes,
    generate_signing_key,
    get_verify_key,
    read_signing_keys,
    write_signing_keys,
)
from signedjson.sign import SignatureVerifyException, sign_json, verify_signed_json
from signedjson.types import SigningKey, VerifyKey

from roomstream.errors import EventSignatureError
from roomstream.events.model import Event
from roomstream.events.redaction import redact
from roomstream.events.room_versions import RoomVersion
from roomstream.events.types import EventTypes

__all__ = [
    "SigningKey",
    "VerifyKey",
    "VerifyKeys",
    "check_event_signatures",
    "decode_verify_key_bytes",
    "get_verify_key",
    "key_id",
    "load_or_create_signing_key",
    "required_signers",
    "sign_event",
    "signing_key_path",
    "verify_event_signature",
]

logger = logging.getLogger(__name__)

_VERSION_ALPHABET = string.ascii_letters + string.digits


def key_id(key: SigningKey | VerifyKey) -> str:
    """The key's identifier as used in ``signatures``, e.g. ``ed25519:a_Xy3Z``."""
    return f"{key.alg}:{key.version}"


def signing_key_path(data_dir: str | os.PathLike[str], server_name: str) -> Path:
    """Where the signing key for ``server_name`` lives inside ``data_dir``."""
    if not server_name or "/" in server_name or "\0" in server_name or server_name[0] == ".":
        raise ValueError(f"unusable server name for a key file: {server_name!r}")
    return Path(data_dir) / f"{server_name}.signing.key"


def _read_key_file(path: Path) -> SigningKey:
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        logger.warning("signing key %s is accessible by other users (mode %o)", path, mode)
    with path.open("r", encoding="ascii") as f:
        try:
            keys = read_signing_keys(f)
        except Exception as e:  # malformed lines raise ValueError, bad base64 others
            raise ValueError(f"cannot parse signing key file {path}: {e}") from e
    if len(keys) != 1:
        raise ValueError(f"signing key file {path} must hold exactly one key")
    key: SigningKey = keys[0]
    if key.alg != NACL_ED25519:
        raise ValueError(f"signing key in {path} is not ed25519")
    return key


def load_or_create_signing_key(data_dir: str | os.PathLike[str], server_name: str) -> SigningKey:
    """Load this server's signing key, generating and storing one on first use."""
    path = signing_key_path(data_dir, server_name)
    if path.exists():
        return _read_key_file(path)

    Path(data_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
    version = "a_" + "".join(secrets.choice(_VERSION_ALPHABET) for _ in range(4))
    key = generate_signing_key(version)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)  # the umask may have removed bits; make the mode exact
        with os.fdopen(fd, "w", encoding="ascii") as f:
            write_signing_keys(f, [key])
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            # Another process created the key first; use theirs so all agree.
            return _read_key_file(path)
    finally:
        tmp.unlink(missing_ok=True)
    logger.info("generated signing key %s for %s in %s", key_id(key), server_name, path)
    return key


def _signable(event_dict: Mapping[str, Any], room_version: RoomVersion) -> dict[str, Any]:
    redacted = redact(event_dict, room_version)
    redacted.pop("signatures", None)
    redacted.pop("unsigned", None)
    return redacted


def sign_event(
    event_dict: dict[str, Any],
    server_name: str,
    signing_key: SigningKey,
    *,
    room_version: RoomVersion,
) -> dict[str, Any]:
    """Add ``server_name``'s signature to ``event_dict`` (in place) and return it.

    The event must already carry its content hash (:func:`hashing.add_content_hash`):
    the signature covers ``hashes`` but not the stripped content. Signatures from other
    servers, and other keys of this server, are preserved.
    """
    signed = sign_json(_signable(event_dict, room_version), server_name, signing_key)
    signature = signed["signatures"][server_name][key_id(signing_key)]
    existing = event_dict.get("signatures")
    signatures: dict[str, dict[str, Any]] = {}
    if isinstance(existing, Mapping):
        signatures = {k: dict(v) for k, v in existing.items() if isinstance(v, Mapping)}
    signatures.setdefault(server_name, {})[key_id(signing_key)] = signature
    event_dict["signatures"] = signatures
    return event_dict


def verify_event_signature(
    event_dict: Mapping[str, Any],
    server_name: str,
    verify_key: VerifyKey,
    *,
    room_version: RoomVersion,
) -> bool:
    """True if ``event_dict`` carries a valid signature by ``server_name`` with this key.

    Works on full and redacted copies alike (the signature covers the redacted form).
    Never raises for malformed signatures; they simply do not verify.
    """
    signatures = event_dict.get("signatures")
    if not isinstance(signatures, Mapping):
        return False
    by_server = signatures.get(server_name)
    if not isinstance(by_server, Mapping) or not isinstance(by_server.get(key_id(verify_key)), str):
        return False
    signable = _signable(event_dict, room_version)
    signable["signatures"] = {server_name: {key_id(verify_key): by_server[key_id(verify_key)]}}
    try:
        verify_signed_json(signable, server_name, verify_key)
    except (SignatureVerifyException, ValueError):
        # ValueError: values canonicaljson cannot encode (e.g. lone surrogates).
        return False
    return True


VerifyKeys = Mapping[str, Mapping[str, VerifyKey]]
"""Known verify keys: server name -> key ID (``ed25519:...``) -> key."""


def _server_of(user_id: object) -> str | None:
    if not isinstance(user_id, str):
        return None
    _, sep, server = user_id.partition(":")
    return server if sep and server else None


def required_signers(
    event_dict: Mapping[str, Any], room_version: RoomVersion | None = None
) -> set[str]:
    """The servers whose signatures a received event must carry (server-server API,
    "Validating hashes and signatures on received events"):

    * the server of the ``sender``, except for an invite made from a third-party invite
      (its ``sender`` must be the original inviter while another server may have built
      it; the ``third_party_invite.signed`` block is checked by the auth rules instead);
    * room versions 1 and 2: the server of the ``event_id`` (the server that built it);
    * from room version 8 (restricted join rules), for a join carrying
      ``join_authorised_via_users_server``, the server of that authorising user.

    ``room_version`` None: the rules of room versions 10 to 12 (no event ID field;
    restricted joins).
    """
    servers: set[str] = set()
    content = event_dict.get("content")
    content = content if isinstance(content, Mapping) else {}
    is_member = event_dict.get("type") == EventTypes.MEMBER
    membership = content.get("membership")
    if not (is_member and membership == "invite" and "third_party_invite" in content):
        sender_server = _server_of(event_dict.get("sender"))
        if sender_server is not None:
            servers.add(sender_server)
    if room_version is not None and room_version.event_ids_in_pdu:
        event_id_server = _server_of(event_dict.get("event_id"))
        if event_id_server is not None:
            servers.add(event_id_server)
    restricted = room_version is None or room_version.restricted_join_rule
    if restricted and is_member and membership == "join":
        authorising = content.get("join_authorised_via_users_server")
        if authorising is not None:
            authorising_server = _server_of(authorising)
            # A malformed value names no server that could sign; the auth rules refuse it.
            if authorising_server is not None:
                servers.add(authorising_server)
    return servers


def check_event_signatures(event: Event, verify_keys: VerifyKeys) -> None:
    """Raise :class:`EventSignatureError` unless every server of :func:`required_signers`
    signed ``event`` with a key in ``verify_keys`` (:func:`check_signed_by` each)."""
    for server in sorted(required_signers(event.data, event.room_version)):
        check_signed_by(event, server, verify_keys)


def check_signed_by(event: Event, server: str, verify_keys: VerifyKeys) -> None:
    """Raise :class:`EventSignatureError` unless ``server`` signed ``event`` with a key in
    ``verify_keys``.

    One valid signature is enough (a server may sign with several keys, of which the
    receiver knows some). Works on a redacted copy too: signatures cover the redacted
    form. The message names the server, the key IDs it signed with and the keys known
    for it, so an operator can tell a missing key from a bad signature.
    """
    signatures = event.data.get("signatures")
    by_server = signatures.get(server) if isinstance(signatures, Mapping) else None
    signed_with = sorted(by_server) if isinstance(by_server, Mapping) else []
    known = verify_keys.get(server, {})
    usable = [known[k] for k in signed_with if k in known]
    if not usable:
        raise EventSignatureError(
            f"{event.event_id} is not signed by {server} with a known key "
            f"(signed with: {', '.join(signed_with) or 'nothing'}; "
            f"keys known for {server}: {', '.join(sorted(known)) or 'none'})"
        )
    if not any(
        verify_event_signature(event.data, server, key, room_version=event.room_version)
        for key in usable
    ):
        raise EventSignatureError(
            f"{event.event_id}: the signature of {server} "
            f"({', '.join(key_id(k) for k in usable)}) does not verify"
        )
