"""Checking the signed JSON clients upload: device keys and cross-signing keys.

Pure functions (no I/O). A key object is refused with 400 ``M_INVALID_PARAM`` when it is
not shaped as the spec says or when a signature it must carry does not verify. Invariant:
a signature counts only if it verifies with ed25519 over the object's canonical JSON
without ``signatures`` and ``unsigned`` (signedjson's rule).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from signedjson.key import decode_verify_key_bytes
from signedjson.sign import SignatureVerifyException, verify_signed_json
from unpaddedbase64 import decode_base64

from roomstream.errors import InvalidParamError, MatrixError

__all__ = [
    "CROSS_SIGNING_USAGES",
    "check_cross_signing_key",
    "check_device_keys",
    "cross_signing_public_key",
    "has_valid_signature",
]

#: Key type (the upload's field) -> the ``usage`` its key object must list.
CROSS_SIGNING_USAGES = {
    "master_key": "master",
    "self_signing_key": "self_signing",
    "user_signing_key": "user_signing",
}


def _invalid(message: str) -> MatrixError:
    return InvalidParamError(message)


def has_valid_signature(
    signed: Mapping[str, Any], signer_user: str, key_id: str, public_key: str
) -> bool:
    """Whether ``signed`` carries a signature by ``signer_user``'s ``key_id``
    (``ed25519:...``) that verifies with ``public_key`` (unpadded base64)."""
    signatures = signed.get("signatures")
    if not isinstance(signatures, Mapping):
        return False
    by_user = signatures.get(signer_user)
    if not isinstance(by_user, Mapping) or not isinstance(by_user.get(key_id), str):
        return False
    try:
        verify_key = decode_verify_key_bytes(key_id, decode_base64(public_key))
        verify_signed_json(dict(signed), signer_user, verify_key)
    except (SignatureVerifyException, ValueError, TypeError, KeyError):
        return False
    except Exception:  # e.g. canonical JSON refusing a float: then it is not signed
        return False
    return True


def check_device_keys(keys: Any, user_id: str, device_id: str) -> dict[str, Any]:
    """``device_keys`` of ``POST /keys/upload``: for this user and device, with an
    ``ed25519:<device_id>`` key that signed the object."""
    if not isinstance(keys, dict):
        raise _invalid("device_keys must be an object")
    if keys.get("user_id") != user_id or keys.get("device_id") != device_id:
        raise _invalid("device_keys must name the user and device of the access token")
    algorithms = keys.get("algorithms")
    if not isinstance(algorithms, list) or not all(isinstance(a, str) for a in algorithms):
        raise _invalid("device_keys.algorithms must be a list of strings")
    public_keys = keys.get("keys")
    if not isinstance(public_keys, dict) or not all(
        isinstance(v, str) for v in public_keys.values()
    ):
        raise _invalid("device_keys.keys must map key IDs to keys")
    own_key_id = f"ed25519:{device_id}"
    own_key = public_keys.get(own_key_id)
    if not isinstance(own_key, str):
        raise _invalid(f"device_keys.keys needs {own_key_id}")
    if not has_valid_signature(keys, user_id, own_key_id, own_key):
        raise _invalid("device_keys are not signed by the device's own ed25519 key")
    return keys


def cross_signing_public_key(key: Mapping[str, Any]) -> tuple[str, str]:
    """(key ID ``ed25519:<public key>``, public key) of a cross-signing key object: it has
    exactly one key."""
    keys = key.get("keys")
    if not isinstance(keys, Mapping) or len(keys) != 1:
        raise _invalid("a cross-signing key must have exactly one key")
    ((key_id, public_key),) = keys.items()
    if not isinstance(key_id, str) or not isinstance(public_key, str):
        raise _invalid("a cross-signing key's keys must map a key ID to a key")
    if key_id != f"ed25519:{public_key}":
        raise _invalid("a cross-signing key's ID must be ed25519:<its public key>")
    return key_id, public_key


def check_cross_signing_key(
    key: Any,
    user_id: str,
    key_type: str,
    signer: tuple[str, str] | None,
) -> dict[str, Any]:
    """A cross-signing key object of ``user_id`` with the usage ``key_type`` asks for;
    ``signer`` ((key ID, public key) of the master key) must have signed it (self-signing
    and user-signing keys)."""
    if not isinstance(key, dict):
        raise _invalid(f"{key_type} must be an object")
    if key.get("user_id") != user_id:
        raise _invalid(f"{key_type} must be a key of {user_id}")
    usage = key.get("usage")
    if not isinstance(usage, list) or CROSS_SIGNING_USAGES[key_type] not in usage:
        raise _invalid(f"{key_type} must have usage {CROSS_SIGNING_USAGES[key_type]!r}")
    cross_signing_public_key(key)
    if signer is not None and not has_valid_signature(key, user_id, *signer):
        raise _invalid(f"{key_type} must be signed by the master key")
    return key
