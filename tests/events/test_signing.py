"""Signing keys on disk and event signatures, with the spec's test vectors."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

import pytest
from signedjson.key import decode_signing_key_base64, generate_signing_key
from signedjson.sign import sign_json
from unpaddedbase64 import decode_base64

from roomstream.events.format import build_event_dict, finalise_local_event
from roomstream.events.hashing import add_content_hash, reference_hash_preimage
from roomstream.events.model import Event
from roomstream.events.room_versions import ROOM_V10, ROOM_V11, ROOM_V12
from roomstream.events.signing import (
    EventSignatureError,
    check_event_signatures,
    get_verify_key,
    key_id,
    load_or_create_signing_key,
    required_signers,
    sign_event,
    signing_key_path,
    verify_event_signature,
)

# Spec appendix "Cryptographic test vectors".
from tests.events.vectors import SPEC_MINIMAL_EVENT, SPEC_REDACTABLE_EVENT

SEED = "YJDBA9Xnr2sVqXD9Vj7XVUnmFZcZrlw8Md7kMW+3XA1"
KEY = decode_signing_key_base64("ed25519", "1", SEED)
VERIFY_KEY = get_verify_key(KEY)

MINIMAL: dict[str, Any] = SPEC_MINIMAL_EVENT
MINIMAL_SIG = (
    "KxwGjPSDEtvnFgU00fwFz+l6d2pJM6XBIaMEn81SXPTRl16AqLAYqfIReFGZlHi5KLjAWbOoMszkwsQma+lYAg"
)
REDACTABLE: dict[str, Any] = SPEC_REDACTABLE_EVENT
REDACTABLE_SIG = (
    "Wm+VzmOUOz08Ds+0NTWb1d4CZrVsJSikkeRxh6aCcUwu6pNC78FunoD7KNWzqFn241eYHYMGCA5McEiVPdhzBA"
)


def test_spec_json_signing_vectors() -> None:
    # Sanity check of the key and of signedjson against the spec.
    assert sign_json({}, "domain", KEY)["signatures"]["domain"]["ed25519:1"] == (
        "K8280/U9SSy9IVtjBuVeLr+HpOB4BQFWbg+UZaADMtTdGYI7Geitb76LTrr5QV/7Xg4ahLwYGYZzuHGZKM5ZAQ"
    )
    assert sign_json({"one": 1, "two": "Two"}, "domain", KEY)["signatures"]["domain"][
        "ed25519:1"
    ] == ("KqmLSbO39/Bzb0QIYE82zqLwsA+PDzYIpIRA2sRQ4sL53+sN6/fpNSoqE7BP7vBZhG6kYdD13EIMJpvhJI+6Bw")


@pytest.mark.parametrize(
    ("event", "signature"), [(MINIMAL, MINIMAL_SIG), (REDACTABLE, REDACTABLE_SIG)]
)
def test_spec_event_signing_vectors(event: dict[str, Any], signature: str) -> None:
    # The spec's vectors keep `origin`, i.e. the pre-v11 redaction rules (as in v10).
    signed = sign_event(add_content_hash(dict(event)), "domain", KEY, room_version=ROOM_V10)
    assert signed["signatures"] == {"domain": {"ed25519:1": signature}}
    assert signed["unsigned"] == {"age_ts": 1000000}
    assert verify_event_signature(signed, "domain", VERIFY_KEY, room_version=ROOM_V10)
    # The reference hash is taken over exactly the bytes the signature covers, so the
    # spec's signature also pins down our reference-hash input.
    VERIFY_KEY.verify(reference_hash_preimage(signed, ROOM_V10), decode_base64(signature))


def test_v11_signature_differs_because_origin_is_not_protected() -> None:
    event = add_content_hash(dict(MINIMAL))
    v11 = sign_event(dict(event), "domain", KEY, room_version=ROOM_V11)
    assert v11["signatures"]["domain"]["ed25519:1"] != MINIMAL_SIG
    assert verify_event_signature(v11, "domain", VERIFY_KEY, room_version=ROOM_V11)
    assert not verify_event_signature(v11, "domain", VERIFY_KEY, room_version=ROOM_V10)
    # In v11 `origin` is not covered, so changing it keeps the signature valid.
    assert verify_event_signature(
        dict(v11, origin="elsewhere"), "domain", VERIFY_KEY, room_version=ROOM_V11
    )


def test_signature_survives_redaction_but_not_tampering() -> None:
    signed = sign_event(add_content_hash(dict(REDACTABLE)), "domain", KEY, room_version=ROOM_V12)
    ok = {"room_version": ROOM_V12}
    assert verify_event_signature(signed, "domain", VERIFY_KEY, **ok)
    assert verify_event_signature(dict(signed, content={}), "domain", VERIFY_KEY, **ok)
    assert not verify_event_signature(dict(signed, origin_server_ts=1), "domain", VERIFY_KEY, **ok)
    assert not verify_event_signature(signed, "other", VERIFY_KEY, **ok)
    other_key = get_verify_key(generate_signing_key("1"))
    assert not verify_event_signature(signed, "domain", other_key, **ok)
    for bad in (
        {},
        {"domain": "x"},
        {"domain": {"ed25519:1": 5}},
        {"domain": {"ed25519:1": "!!"}},
        "x",
    ):
        assert not verify_event_signature(dict(signed, signatures=bad), "domain", VERIFY_KEY, **ok)


def test_sign_event_keeps_other_signatures() -> None:
    event = add_content_hash(dict(MINIMAL, signatures={"other.org": {"ed25519:x": "sig"}}))
    sign_event(event, "domain", KEY, room_version=ROOM_V10)
    assert event["signatures"]["other.org"] == {"ed25519:x": "sig"}
    assert event["signatures"]["domain"] == {"ed25519:1": MINIMAL_SIG}


def test_key_created_once_with_private_mode(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    key = load_or_create_signing_key(data_dir, "example.org")
    path = signing_key_path(data_dir, "example.org")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    assert re.fullmatch(r"ed25519:a_[A-Za-z0-9]{4}", key_id(key))
    line = path.read_text()
    assert re.fullmatch(r"ed25519 a_[A-Za-z0-9]{4} [A-Za-z0-9+/]{43}\n", line)
    again = load_or_create_signing_key(data_dir, "example.org")
    assert key_id(again) == key_id(key) and again.encode() == key.encode()
    assert [p.name for p in data_dir.iterdir()] == ["example.org.signing.key"]
    # A different server name gets its own key.
    assert load_or_create_signing_key(data_dir, "other.org:8448").encode() != key.encode()


def test_key_mode_is_exact_despite_umask(tmp_path: Path) -> None:
    old = os.umask(0o000)
    try:
        load_or_create_signing_key(tmp_path, "example.org")
    finally:
        os.umask(old)
    assert stat.S_IMODE(signing_key_path(tmp_path, "example.org").stat().st_mode) == 0o600


def test_existing_key_file_is_used_and_corrupt_one_is_an_error(tmp_path: Path) -> None:
    path = signing_key_path(tmp_path, "example.org")
    path.write_text(f"ed25519 a_abcd {SEED}\n")
    key = load_or_create_signing_key(tmp_path, "example.org")
    assert key_id(key) == "ed25519:a_abcd" and key.encode() == KEY.encode()
    path.write_text("garbage\n")
    with pytest.raises(ValueError):
        load_or_create_signing_key(tmp_path, "example.org")
    assert path.read_text() == "garbage\n"  # never silently replaced


def test_race_loser_uses_winners_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = signing_key_path(tmp_path, "example.org")
    real_link = os.link

    def link_after_competitor(src: Any, dst: Any) -> None:
        path.write_text(f"ed25519 a_win1 {SEED}\n")
        real_link(src, dst)

    monkeypatch.setattr(os, "link", link_after_competitor)
    key = load_or_create_signing_key(tmp_path, "example.org")
    assert key_id(key) == "ed25519:a_win1"
    assert [p.name for p in tmp_path.iterdir()] == ["example.org.signing.key"]


@pytest.mark.parametrize("name", ["", "a/b", ".hidden", "x\0y"])
def test_unusable_server_names(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError):
        signing_key_path(tmp_path, name)


def _member(content: dict[str, Any], sender: str = "@joiner:joining.test") -> Event:
    data = build_event_dict(
        ROOM_V12,
        event_type="m.room.member",
        sender=sender,
        content=content,
        prev_events=["$prev"],
        auth_events=["$auth"],
        depth=5,
        room_id="!" + "R" * 43,
        state_key=sender,
        origin_server_ts=1,
    )
    return finalise_local_event(data, ROOM_V12, "joining.test", JOINING)


JOINING = decode_signing_key_base64("ed25519", "j", SEED)
RESIDENT = decode_signing_key_base64("ed25519", "r", "D" * 43)
KEYS = {
    "joining.test": {key_id(JOINING): get_verify_key(JOINING)},
    "resident.test": {key_id(RESIDENT): get_verify_key(RESIDENT)},
}


def test_required_signers_follow_the_spec() -> None:
    plain = {"type": "m.room.message", "sender": "@a:one.test", "content": {}}
    assert required_signers(plain) == {"one.test"}
    restricted = {
        "type": "m.room.member",
        "sender": "@a:one.test",
        "content": {"membership": "join", "join_authorised_via_users_server": "@r:two.test"},
    }
    assert required_signers(restricted) == {"one.test", "two.test"}
    # Only joins carry an authorising server's signature.
    leave = {**restricted, "content": {**restricted["content"], "membership": "leave"}}
    assert required_signers(leave) == {"one.test"}
    # An invite made from a third-party invite is exempt from the sender's signature.
    third_party = {
        "type": "m.room.member",
        "sender": "@a:one.test",
        "content": {"membership": "invite", "third_party_invite": {"signed": {}}},
    }
    assert required_signers(third_party) == set()


def test_restricted_join_needs_the_authorising_servers_signature() -> None:
    join = _member({"membership": "join", "join_authorised_via_users_server": "@r:resident.test"})
    # Signed by the joining server only: the resident (authorising) server is missing.
    with pytest.raises(EventSignatureError, match=r"not signed by resident\.test"):
        check_event_signatures(join, KEYS)
    data = sign_event(dict(join.data), "resident.test", RESIDENT, room_version=ROOM_V12)
    both = Event(data, ROOM_V12, join.event_id, b"")
    check_event_signatures(both, KEYS)
    # ... and the joining server's own signature is still required.
    only_resident = Event(
        {**data, "signatures": {"resident.test": data["signatures"]["resident.test"]}},
        ROOM_V12,
        join.event_id,
        b"",
    )
    with pytest.raises(EventSignatureError, match=r"not signed by joining\.test"):
        check_event_signatures(only_resident, KEYS)
    # A signature under a known key ID that does not verify names the key.
    broken = Event(
        {**data, "signatures": {**data["signatures"], "joining.test": {"ed25519:j": "A" * 86}}},
        ROOM_V12,
        join.event_id,
        b"",
    )
    with pytest.raises(EventSignatureError, match=r"ed25519:j\) does not verify"):
        check_event_signatures(broken, KEYS)
