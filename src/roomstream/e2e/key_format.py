"""``/keys/query``'s answer per user, formatted from the stored rows (pure functions).

A user's part (:class:`UserKeys`) is JSON text, ready for ``orjson.dumps`` as
:class:`orjson.Fragment`: stored key objects are passed on as stored (orjson's compact
output of the uploaded object), decoded only to merge signatures others uploaded on them.
Invariant: the text is exactly what decoding, adding ``unsigned.device_display_name`` and
merging the signatures, then encoding, gives (tests/e2e/test_query_format.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = ["UserKeys", "device_keys_json", "format_user_keys", "merge_signatures"]


def merge_signatures(
    obj: dict[str, Any], extra: Mapping[str, Mapping[str, str]] | None
) -> dict[str, Any]:
    if not extra:
        return obj
    own = obj.get("signatures")
    signatures = {
        u: dict(s) for u, s in (own.items() if isinstance(own, dict) else ()) if isinstance(s, dict)
    }
    for user, by_key in extra.items():
        signatures.setdefault(user, {}).update(by_key)
    return {**obj, "signatures": signatures}


def _unsigned(name: str | None) -> str:
    return "{}" if name is None else '{"device_display_name":' + orjson.dumps(name).decode() + "}"


def device_keys_json(
    raw: str, name: str | None, extra: Mapping[str, Mapping[str, str]] | None
) -> str:
    """A device's stored keys as ``/keys/query`` gives them: with ``unsigned`` holding
    its display name, and the signatures others uploaded on it (``extra``) merged in.

    The common case (no uploaded signatures, no ``unsigned`` stored) splices the stored
    text, which is orjson's compact output of an object: dropping its closing brace and
    appending a member gives the same JSON as decoding, adding and encoding (any
    ``"unsigned"`` anywhere in the text sends it the slow way, so no member is doubled)."""
    if not extra and '"unsigned"' not in raw and len(raw) > 2 and raw[-1] == "}":
        return f'{raw[:-1]},"unsigned":{_unsigned(name)}}}'
    keys = merge_signatures(dict(orjson.loads(raw)), extra)
    stored = keys.get("unsigned")
    unsigned = dict(stored) if isinstance(stored, dict) else {}
    if name is not None:
        unsigned["device_display_name"] = name
    keys["unsigned"] = unsigned
    return orjson.dumps(keys).decode()


def cross_signing_json(raw: str, extra: Mapping[str, Mapping[str, str]] | None) -> str:
    if not extra:
        return raw
    return orjson.dumps(merge_signatures(dict(orjson.loads(raw)), extra)).decode()


@dataclass(frozen=True, slots=True)
class UserKeys:
    """One user's part of a ``/keys/query`` answer, formatted (JSON text): what every
    requester gets, but for the user-signing key, which only its owner may see."""

    #: device ID -> its keys (see :func:`device_keys_json`)
    devices: dict[str, str]
    #: every device's keys as one JSON object
    all_devices: orjson.Fragment
    #: key type (``master``, ``self_signing``, ``user_signing``) -> the key object
    cross: dict[str, orjson.Fragment]

    def select(self, device_ids: Iterable[str]) -> orjson.Fragment | dict[str, orjson.Fragment]:
        """The keys of ``device_ids`` that have keys (none named: all)."""
        wanted = list(device_ids)
        if not wanted:
            return self.all_devices
        return {d: orjson.Fragment(self.devices[d]) for d in wanted if d in self.devices}


def format_user_keys(
    devices: Mapping[str, tuple[str, str | None]],
    cross: Mapping[str, tuple[str, str]],
    signatures: Mapping[str, Mapping[str, Mapping[str, str]]],
) -> UserKeys:
    """A user's :class:`UserKeys` from the stored rows (see the store functions)."""
    formatted = {
        device_id: device_keys_json(raw, name, signatures.get(device_id))
        for device_id, (raw, name) in devices.items()
    }
    members = ",".join(f"{orjson.dumps(d).decode()}:{text}" for d, text in formatted.items())
    return UserKeys(
        devices=formatted,
        all_devices=orjson.Fragment("{" + members + "}"),
        cross={
            kind: orjson.Fragment(cross_signing_json(raw, signatures.get(public_key)))
            for kind, (public_key, raw) in cross.items()
        },
    )
