"""Room versions 1 to 12 checked against Synapse's own library, field for field.

Synapse (the reference the issue names) is imported only here, in tests: its event
classes (``make_event_from_dict``), its redaction (``redact_event_dict``), its hashes
(``compute_content_hash``, ``compute_event_reference_hash``) and its signing
(``add_hashes_and_signatures``) see the same inputs as roomstream's, for generated events
of every version: event IDs, redacted forms, content hashes, prev/auth event IDs and
signatures must agree, both ways (events built here read by Synapse, and events built
by Synapse parsed here).
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from signedjson.key import generate_signing_key, get_verify_key
from signedjson.sign import verify_signed_json

from roomstream.errors import AuthError, BadEventError
from roomstream.events.auth import check_auth_rules
from roomstream.events.canonical import encode_canonical_json_fast
from roomstream.events.format import (
    build_event_dict,
    finalise_local_event,
    parse_pdu,
    reference_hash_of,
)
from roomstream.events.hashing import (
    compute_content_hash,
    compute_event_id,
    compute_reference_hash,
)
from roomstream.events.model import Event
from roomstream.events.redaction import redact
from roomstream.events.room_versions import KNOWN_ROOM_VERSIONS, RoomVersion
from roomstream.events.signing import check_event_signatures, key_id, required_signers
from roomstream.state.resolution import effective_auth_event_ids

synapse_versions = pytest.importorskip("synapse.api.room_versions")
synapse_events = pytest.importorskip("synapse.events")
synapse_signing = pytest.importorskip("synapse.crypto.event_signing")
synapse_rust_events = pytest.importorskip("synapse.synapse_rust.events")

VERSIONS = [KNOWN_ROOM_VERSIONS[str(n)] for n in range(1, 13)]
VERSION_IDS = [v.identifier for v in VERSIONS]


def synapse_version(version: RoomVersion) -> Any:
    return synapse_versions.KNOWN_ROOM_VERSIONS[version.identifier]


def test_every_synapse_room_version_flag_matches() -> None:
    """Each flag of ours has Synapse's value for the same version."""
    for version in VERSIONS:
        theirs = synapse_version(version)
        assert version.special_case_aliases_auth == theirs.special_case_aliases_auth
        assert version.strict_canonical_json == theirs.strict_canonicaljson
        assert version.enforce_key_validity == theirs.enforce_key_validity
        assert version.limit_notifications_power_levels == (theirs.limit_notifications_power_levels)
        assert version.knock_join_rule == theirs.knock_join_rule
        assert version.restricted_join_rule == theirs.restricted_join_rule
        assert version.restricted_join_rule_fix == theirs.restricted_join_rule_fix
        assert version.knock_restricted_join_rule == theirs.knock_restricted_join_rule
        assert version.enforce_int_power_levels == theirs.enforce_int_power_levels
        assert version.strict_event_byte_limits == (theirs.strict_event_byte_limits_room_versions)
        assert version.updated_redaction_rules == theirs.updated_redaction_rules
        assert version.implicit_room_creator == theirs.implicit_room_creator
        assert version.room_id_from_create_event == theirs.msc4291_room_ids_as_hashes
        assert version.privileged_creators == theirs.msc4289_creator_power_enabled
        assert version.event_ids_in_pdu == (theirs.event_format == 1)
        assert version.state_resolution.value == {1: "v1", 2: "v2", 3: "v2.1"}[theirs.state_res]


# --------------------------------------------------------------------------------------
# Generated events
# --------------------------------------------------------------------------------------

TYPES = [
    "m.room.create",
    "m.room.member",
    "m.room.join_rules",
    "m.room.power_levels",
    "m.room.history_visibility",
    "m.room.aliases",
    "m.room.redaction",
    "m.room.third_party_invite",
    "m.room.message",
    "x.custom",
]
CONTENT_KEYS = [
    "membership",
    "join_authorised_via_users_server",
    "third_party_invite",
    "creator",
    "room_version",
    "join_rule",
    "allow",
    "aliases",
    "ban",
    "events",
    "events_default",
    "kick",
    "redact",
    "state_default",
    "users",
    "users_default",
    "invite",
    "notifications",
    "history_visibility",
    "redacts",
    "body",
    "signed",
]
# (No top-level "age_ts", "outlier" or "destinations": Synapse leaves those out of the
# content hash, the spec and roomstream do not.)
TOP_LEVEL_EXTRAS = ["origin", "membership", "prev_state", "redacts", "extra"]

strict_leaf = st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text(max_size=6)
# Room versions 1 to 5 admit floats and integers of any size.
lenient_leaf = (
    strict_leaf | st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(2**70), 2**70)
)


def json_values(leaf: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.recursive(
        leaf,
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(st.sampled_from([*CONTENT_KEYS, "signed", "x"]), inner, max_size=3)
        ),
        max_leaves=8,
    )


@st.composite
def events_of(draw: st.DrawFn, version: RoomVersion) -> dict[str, Any]:
    leaf = strict_leaf if version.strict_canonical_json else lenient_leaf
    event_type = draw(st.sampled_from(TYPES))
    content = draw(st.dictionaries(st.sampled_from(CONTENT_KEYS), json_values(leaf), max_size=6))
    server = draw(st.sampled_from(["a.example", "b.example:8448"]))
    if version.event_ids_in_pdu:
        ids = st.builds(lambda n: f"${n}:{server}", st.text("abcXYZ019", min_size=1, max_size=8))
        refs = st.lists(st.tuples(ids, st.sampled_from([{}, {"sha256": "aGFzaA"}])), max_size=3)
        prev = [list(pair) for pair in draw(refs)]
        auth = [list(pair) for pair in draw(refs)]
    else:
        ids = st.builds(lambda n: f"${n}", st.text("abcXYZ019+/-_", min_size=1, max_size=43))
        prev = draw(st.lists(ids, max_size=3))
        auth = draw(st.lists(ids, max_size=3))
    event: dict[str, Any] = {
        "type": event_type,
        "sender": f"@u:{server}",
        "content": content,
        "prev_events": prev,
        "auth_events": auth,
        "depth": draw(st.integers(0, 2**53 - 1)),
        "origin_server_ts": draw(st.integers(0, 2**53 - 1)),
        "hashes": {"sha256": "aGFzaA"},
        "signatures": {server: {"ed25519:k": "c2ln"}},
    }
    if not (version.room_id_from_create_event and event_type == "m.room.create"):
        event["room_id"] = (
            "!" + "A" * 43 if version.room_id_from_create_event else f"!room:{server}"
        )
    if version.event_ids_in_pdu:
        event["event_id"] = f"$ev{draw(st.integers(0, 999))}:{server}"
    if draw(st.booleans()):
        event["state_key"] = draw(st.sampled_from(["", "@u:a.example", "a.example"]))
    if version.room_id_from_create_event and event_type == "m.room.create":
        event["state_key"] = ""  # else Synapse cannot tell which room it is in
    for key in draw(st.lists(st.sampled_from(TOP_LEVEL_EXTRAS), max_size=3, unique=True)):
        event[key] = draw(json_values(leaf))
    if draw(st.booleans()):
        event["unsigned"] = {"age": draw(st.integers(0, 1000))}
    return event


@pytest.mark.parametrize("version", VERSIONS, ids=VERSION_IDS)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_redaction_and_hashes_match_synapse(version: RoomVersion, data: st.DataObject) -> None:
    event = data.draw(events_of(version))
    theirs_version = synapse_version(version)
    original = copy.deepcopy(event)

    theirs_redacted = synapse_rust_events.redact_event_dict(theirs_version, event)
    # Synapse keeps an (emptied) "unsigned"; roomstream leaves it to storage. Neither is
    # hashed or signed.
    theirs_redacted.pop("unsigned", None)
    assert redact(event, version) == theirs_redacted
    _, content_digest = synapse_signing.compute_content_hash(dict(event), hashlib.sha256)
    assert compute_content_hash(event) == content_digest

    theirs = synapse_events.make_event_from_dict(copy.deepcopy(event), theirs_version)
    _, reference_digest = synapse_signing.compute_event_reference_hash(theirs)
    assert compute_reference_hash(event, version) == reference_digest
    assert compute_event_id(event, version) == theirs.event_id

    ours = Event(event, version, compute_event_id(event, version))
    assert ours.prev_event_ids == theirs.prev_event_ids()
    # (v12: Synapse's auth_event_ids() adds the create event, as ours effective ones do.)
    assert effective_auth_event_ids(ours) == list(theirs.auth_event_ids())
    assert event == original  # nothing here modifies its input


def test_version_3_event_ids_use_standard_base64() -> None:
    """v3 and v4 hash alike and differ only in the alphabet: find an event whose hash
    has a ``+`` or ``/`` and check both against Synapse."""
    v3, v4 = KNOWN_ROOM_VERSIONS["3"], KNOWN_ROOM_VERSIONS["4"]
    for n in range(200):
        event = {
            "type": "m.room.message",
            "room_id": "!r:a.example",
            "sender": "@u:a.example",
            "content": {"n": n},
            "prev_events": [],
            "auth_events": [],
            "depth": 1,
            "origin_server_ts": 1,
            "hashes": {"sha256": "x"},
            "signatures": {},
        }
        id3 = compute_event_id(event, v3)
        if "+" in id3 or "/" in id3:
            break
    else:  # pragma: no cover - 200 hashes without either character: (62/64)**8600
        pytest.fail("no hash with + or / found")
    assert id3 == synapse_events.make_event_from_dict(dict(event), synapse_version(v3)).event_id
    id4 = compute_event_id(event, v4)
    assert id4 == synapse_events.make_event_from_dict(dict(event), synapse_version(v4)).event_id
    assert id4 == id3.replace("+", "-").replace("/", "_")


# --------------------------------------------------------------------------------------
# Built here, read by Synapse; built by Synapse, parsed here
# --------------------------------------------------------------------------------------

SIGNING_KEY = generate_signing_key("a_test")
SERVER = "a.example"


def _local(version: RoomVersion, **overrides: Any) -> Event:
    args: dict[str, Any] = {
        "event_type": "m.room.message",
        "sender": f"@u:{SERVER}",
        "content": {"body": "hello"},
        "prev_events": [],
        "auth_events": [],
        "depth": 3,
        "room_id": None if version.room_id_from_create_event else f"!r:{SERVER}",
        "origin_server_ts": 1234,
    }
    if version.room_id_from_create_event:
        args["room_id"] = "!" + "B" * 43
    args.update(overrides)
    return finalise_local_event(build_event_dict(version, **args), version, SERVER, SIGNING_KEY)


@pytest.mark.parametrize("version", VERSIONS, ids=VERSION_IDS)
def test_events_built_here_verify_in_synapse(version: RoomVersion) -> None:
    previous = _local(version)
    hashes = {previous.event_id: reference_hash_of(previous)}
    event = finalise_local_event(
        build_event_dict(
            version,
            event_type="m.room.message",
            sender=f"@u:{SERVER}",
            content={"body": "second"},
            prev_events=[previous.event_id],
            auth_events=[],
            depth=4,
            room_id=previous.room_id,
            reference_hashes=hashes,
        ),
        version,
        SERVER,
        SIGNING_KEY,
    )
    theirs = synapse_events.make_event_from_dict(dict(event.data), synapse_version(version))
    assert theirs.event_id == event.event_id
    assert synapse_signing.check_event_content_hash(theirs)
    assert theirs.prev_event_ids() == [previous.event_id]
    pruned = synapse_rust_events.redact_event(theirs).get_pdu_json()
    pruned.pop("unsigned", None)
    verify_signed_json(pruned, SERVER, get_verify_key(SIGNING_KEY))
    if version.event_ids_in_pdu:
        assert event.event_id.endswith(":" + SERVER)
        # Synapse's form: [event_id, {"sha256": reference hash}].
        assert event.data["prev_events"] == [
            [previous.event_id, {"sha256": hashes[previous.event_id]}]
        ]
        assert event.data["event_id"] == event.event_id
    else:
        assert "event_id" not in event.data
    # And the raw bytes parse back here to the same event.
    assert parse_pdu(event.raw, version).event_id == event.event_id


@pytest.mark.parametrize("version", VERSIONS, ids=VERSION_IDS)
def test_events_built_by_synapse_parse_here(version: RoomVersion) -> None:
    event_dict: dict[str, Any] = {
        "type": "m.room.member",
        "state_key": f"@v:{SERVER}",
        "sender": f"@v:{SERVER}",
        "content": {"membership": "join", "displayname": "V"},
        "prev_events": [["$p:a.example", {"sha256": "aGFzaA"}]]
        if version.event_ids_in_pdu
        else ["$p"],
        "auth_events": [],
        "depth": 10,
        "origin_server_ts": 99,
        "room_id": "!" + "C" * 43 if version.room_id_from_create_event else f"!r:{SERVER}",
    }
    if version.event_ids_in_pdu:
        event_dict["event_id"] = f"$built:{SERVER}"
    if not version.strict_canonical_json:
        event_dict["content"]["weight"] = 1.5
        event_dict["content"]["huge"] = 2**64 + 1
    synapse_signing.add_hashes_and_signatures(
        synapse_version(version), event_dict, SERVER, SIGNING_KEY
    )
    theirs = synapse_events.make_event_from_dict(dict(event_dict), synapse_version(version))
    raw = bytes(synapse_signing.encode_canonical_json(event_dict))
    ours = parse_pdu(raw, version)
    assert ours.event_id == theirs.event_id
    assert ours.raw == raw
    assert ours.prev_event_ids == theirs.prev_event_ids()
    check_event_signatures(ours, {SERVER: {key_id(SIGNING_KEY): get_verify_key(SIGNING_KEY)}})
    assert encode_canonical_json_fast(ours.data, strict=False) == raw


@pytest.mark.parametrize("version", VERSIONS, ids=VERSION_IDS)
def test_floats_and_big_integers_only_before_version_6(version: RoomVersion) -> None:
    if version.strict_canonical_json:
        with pytest.raises(BadEventError):
            _local(version, content={"weight": 1.5})
        with pytest.raises(BadEventError):
            _local(version, content={"huge": 2**60})
    else:
        event = _local(version, content={"weight": 1.5, "huge": 2**64 + 1, "tiny": 1e-7})
        assert event.data["content"] == {"weight": 1.5, "huge": 2**64 + 1, "tiny": 1e-7}
        # Python's repr of floats, as Synapse's encoder writes them.
        assert b'"tiny":1e-07' in event.raw
        assert parse_pdu(event.raw, version).data == event.data


@pytest.mark.parametrize("version", VERSIONS, ids=VERSION_IDS)
def test_event_id_field_only_in_versions_1_and_2(version: RoomVersion) -> None:
    event = _local(version)
    if version.event_ids_in_pdu:
        tampered = dict(event.data)
        del tampered["event_id"]
        with pytest.raises(BadEventError, match="event_id"):
            parse_pdu(encode_canonical_json_fast(tampered, strict=False), version)
        bad_id = dict(event.data, event_id="$no-server-part")
        with pytest.raises(BadEventError, match="event_id"):
            parse_pdu(encode_canonical_json_fast(bad_id, strict=False), version)
        plain_refs = dict(event.data, prev_events=["$p:a.example"])
        with pytest.raises(BadEventError, match="pairs"):
            parse_pdu(encode_canonical_json_fast(plain_refs, strict=False), version)
        # Both the sender's server and the event ID's server must sign.
        other = dict(event.data, event_id="$x:b.example")
        assert required_signers(other, version) == {SERVER, "b.example"}
    else:
        with_id = dict(event.data, event_id="$x:a.example")
        with pytest.raises(BadEventError, match="event_id"):
            parse_pdu(encode_canonical_json_fast(with_id), version)
        assert required_signers(event.data, version) == {SERVER}


@pytest.mark.parametrize("version", VERSIONS, ids=VERSION_IDS)
def test_authorising_server_signs_only_from_version_8(version: RoomVersion) -> None:
    join = {
        "type": "m.room.member",
        "sender": "@u:a.example",
        "state_key": "@u:a.example",
        "content": {"membership": "join", "join_authorised_via_users_server": "@r:b.example"},
    }
    expected = {"a.example", "b.example"} if version.restricted_join_rule else {"a.example"}
    assert required_signers(join, version) == expected


@pytest.mark.parametrize("version_id", ["1", "2"])
def test_a_template_event_id_of_another_server_is_replaced(version_id: str) -> None:
    """A make_join template names the resident server in its event ID; the event this
    server finalises must carry an ID on its own name (it signs it), and one it already
    named itself is kept."""
    version = KNOWN_ROOM_VERSIONS[version_id]
    template = build_event_dict(
        version,
        event_type="m.room.member",
        sender=f"@u:{SERVER}",
        content={"membership": "join"},
        prev_events=["$p:resident.example"],
        auth_events=[],
        depth=2,
        room_id="!r:resident.example",
        state_key=f"@u:{SERVER}",
    )
    template["event_id"] = "$fromtemplate:resident.example"
    # A template's references are pairs already: building from them keeps them.
    rebuilt = build_event_dict(
        version,
        event_type="m.room.member",
        sender=f"@u:{SERVER}",
        content={"membership": "join"},
        prev_events=template["prev_events"],
        auth_events=[["$a:resident.example", {"sha256": "aGFzaA"}]],
        depth=2,
        room_id="!r:resident.example",
        state_key=f"@u:{SERVER}",
    )
    assert rebuilt["prev_events"] == [["$p:resident.example", {}]]
    assert rebuilt["auth_events"] == [["$a:resident.example", {"sha256": "aGFzaA"}]]
    event = finalise_local_event(template, version, SERVER, SIGNING_KEY)
    assert event.event_id.endswith(":" + SERVER) and event.event_id == event.data["event_id"]
    assert required_signers(event.data, version) == {SERVER}
    own = dict(template, event_id=f"$mine:{SERVER}")
    assert finalise_local_event(own, version, SERVER, SIGNING_KEY).event_id == f"$mine:{SERVER}"


@pytest.mark.parametrize("version", VERSIONS, ids=VERSION_IDS)
def test_long_state_keys_as_synapse_judges_them(version: RoomVersion) -> None:
    """A state key of 200 two-byte characters (400 bytes): before v11 Synapse accepts it
    as well formed and stores the event as rejected; from v11 it refuses it outright. So
    does roomstream (parse, then the auth rules). 256 characters: refused everywhere."""
    auth_mod = pytest.importorskip("synapse.event_auth")
    errors = pytest.importorskip("synapse.api.errors")
    data = build_event_dict(
        version,
        event_type="m.room.topic",
        sender=f"@u:{SERVER}",
        content={},
        prev_events=[],
        auth_events=[],
        depth=3,
        room_id="!" + "B" * 43 if version.room_id_from_create_event else f"!r:{SERVER}",
        state_key="é" * 200,
    )
    if version.event_ids_in_pdu:
        data["event_id"] = f"$long:{SERVER}"
    synapse_signing.add_hashes_and_signatures(synapse_version(version), data, SERVER, SIGNING_KEY)
    raw = bytes(synapse_signing.encode_canonical_json(data))
    theirs = synapse_events.make_event_from_dict(dict(data), synapse_version(version))
    with pytest.raises(errors.EventSizeError) as info:
        auth_mod.validate_event_for_room_version(theirs)
    if version.strict_event_byte_limits:
        assert info.value.unpersistable
        with pytest.raises(BadEventError, match="255 bytes"):
            parse_pdu(raw, version)
    else:
        assert not info.value.unpersistable
        parsed = parse_pdu(raw, version)
        with pytest.raises(AuthError, match="state_key is longer than 255 bytes"):
            check_auth_rules(parsed, {})
    with pytest.raises(BadEventError):
        _local(version, event_type="m.room.topic", state_key="é" * 256, content={})
    # This server never builds an event only for it to be rejected.
    with pytest.raises(BadEventError, match="255 bytes"):
        _local(version, event_type="m.room.topic", state_key="é" * 200, content={})
