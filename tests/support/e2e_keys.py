"""Signed key objects as a client makes them (ed25519 via signedjson), for the e2e tests."""

from __future__ import annotations

import copy
from typing import Any

from signedjson.key import generate_signing_key, get_verify_key
from signedjson.sign import sign_json
from signedjson.types import SigningKey
from unpaddedbase64 import encode_base64


def public(key: SigningKey) -> str:
    return encode_base64(get_verify_key(key).encode())


class Device:
    """A device's ed25519 identity key and the objects it signs."""

    def __init__(self, user_id: str, device_id: str) -> None:
        self.user_id = user_id
        self.device_id = device_id
        self.key = generate_signing_key(device_id)

    def device_keys(self, curve: str = "curve-public") -> dict[str, Any]:
        keys = {
            "user_id": self.user_id,
            "device_id": self.device_id,
            "algorithms": ["m.olm.v1.curve25519-aes-sha2", "m.megolm.v1.aes-sha2"],
            "keys": {
                f"curve25519:{self.device_id}": curve,
                f"ed25519:{self.device_id}": public(self.key),
            },
        }
        return sign_json(keys, self.user_id, self.key)

    def one_time_keys(self, ids: list[str]) -> dict[str, Any]:
        return {
            f"signed_curve25519:{i}": sign_json({"key": f"otk-{i}"}, self.user_id, self.key)
            for i in ids
        }


class CrossSigning:
    """A user's master, self-signing and user-signing keys."""

    def __init__(self, user_id: str) -> None:
        self.user_id = user_id
        self.master = generate_signing_key("m")
        self.self_signing = generate_signing_key("s")
        self.user_signing = generate_signing_key("u")

    def key_object(self, key: SigningKey, usage: str) -> dict[str, Any]:
        pub = public(key)
        return {"user_id": self.user_id, "usage": [usage], "keys": {f"ed25519:{pub}": pub}}

    def master_key(self) -> dict[str, Any]:
        return self.key_object(self.master, "master")

    def upload_body(self) -> dict[str, Any]:
        self.master.version = public(self.master)  # type: ignore[attr-defined]
        return {
            "master_key": self.master_key(),
            "self_signing_key": sign_json(
                self.key_object(self.self_signing, "self_signing"), self.user_id, self.master
            ),
            "user_signing_key": sign_json(
                self.key_object(self.user_signing, "user_signing"), self.user_id, self.master
            ),
        }

    def sign(self, key: SigningKey, obj: dict[str, Any]) -> dict[str, Any]:
        """A signed deep copy (signedjson signs in place, sharing nested dicts)."""
        key.version = public(key)  # type: ignore[attr-defined]
        return sign_json(copy.deepcopy(obj), self.user_id, key)


#: The password tests register users with (tests/support/homeserver.py).
PASSWORD = "secret-password"


def password_auth(user_id: str, password: str = PASSWORD, session: str = "") -> dict[str, Any]:
    return {
        "type": "m.login.password",
        "identifier": {"type": "m.id.user", "user": user_id},
        "password": password,
        "session": session,
    }
