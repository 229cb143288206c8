"""The receive path's checks (``RoomEngine.receive_pdus``), on both engines: signatures
against the key store, a new room in one batch, and content hash mismatches."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest
from signedjson.key import decode_signing_key_base64

from roomstream.errors import BadEventError, Codes, EventSignatureError
from roomstream.events.format import (
    build_event_dict,
    finalise_local_event,
    room_id_for_create_event,
)
from roomstream.events.model import Event
from roomstream.events.room_versions import KNOWN_ROOM_VERSIONS, RoomVersion, room_version
from roomstream.events.signing import SigningKey
from roomstream.rooms.engine import RoomEngine
from roomstream.rooms.keys import ServerKeyStore
from tests.support.rooms import REMOTE, remote_event, verify_key_base64

BOB = "@bob:remote.test"
CAROL = "@carol:remote.test"
#: Another key of the remote server, one the engine does not know.
OTHER_KEY = decode_signing_key_base64(
    "ed25519", "other", "YJDBA9Xnr2sVqXD9Vj7XVUnmFZcZrlw8Md7kMW+3XA1"
)


def _remote_room(key: SigningKey, version: RoomVersion) -> list[Event]:
    """A room made on the remote server: create, Bob's join, power levels, a public join
    rule, Carol's join and a message from her (a linear history)."""
    content: dict[str, Any] = {"room_version": version.identifier}
    if not version.implicit_room_creator:
        content["creator"] = BOB
    data = build_event_dict(
        version,
        event_type="m.room.create",
        sender=BOB,
        content=content,
        prev_events=[],
        auth_events=[],
        depth=1,
        state_key="",
        # The v12 create event has no room_id: the room ID is derived from its ID.
        room_id=None if version.room_id_from_create_event else "!fresh:remote.test",
        origin_server_ts=1_700_000_000_000,
    )
    create = finalise_local_event(data, version, REMOTE, key)
    room_id = room_id_for_create_event(create)
    creates = [] if version.room_id_from_create_event else [create.event_id]
    events = [create]

    def add(sender: str, etype: str, content: dict[str, Any], auth: list[str], **kw: Any) -> Event:
        event = remote_event(
            key,
            version,
            room_id,
            sender,
            etype,
            content,
            [events[-1].event_id],
            creates + auth,
            len(events) + 1,
            **kw,
        )
        events.append(event)
        return event

    join = add(BOB, "m.room.member", {"membership": "join"}, [], state_key=BOB)
    users = {} if version.privileged_creators else {BOB: 100}
    levels = add(BOB, "m.room.power_levels", {"users": users}, [join.event_id], state_key="")
    rules = add(
        BOB,
        "m.room.join_rules",
        {"join_rule": "public"},
        [join.event_id, levels.event_id],
        state_key="",
    )
    carol = add(
        CAROL,
        "m.room.member",
        {"membership": "join"},
        [levels.event_id, rules.event_id],
        state_key=CAROL,
    )
    add(
        CAROL,
        "m.room.message",
        {"body": "hi", "msgtype": "m.text"},
        [levels.event_id, carol.event_id],
    )
    return events


async def _count(engine: RoomEngine) -> int:
    return int(
        await engine.db.run_interaction(
            "test_query", lambda t: t.query_one("SELECT COUNT(*) FROM events")[0]
        )
    )


@pytest.mark.parametrize("version", sorted(KNOWN_ROOM_VERSIONS))
async def test_a_new_room_arrives_in_one_batch_in_any_order(
    engine: RoomEngine, remote_key: SigningKey, version: str
) -> None:
    events = _remote_room(remote_key, room_version(version))
    raws = [e.raw for e in events]
    random.Random(7).shuffle(raws)
    results = await engine.receive_pdus(raws)
    assert all(r.rejected_reason is None and not r.outlier for r in results)
    room_id = room_id_for_create_event(events[0])
    assert await engine.store.get_room_version(room_id) == room_version(version)
    assert await engine.store.get_forward_extremities(room_id) == [events[-1].event_id]
    current = await engine.store.get_current_state(room_id)
    assert current[("m.room.member", CAROL)] == events[4].event_id


async def test_unsigned_and_unverifiable_pdus_are_refused(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    events = _remote_room(remote_key, room_version("11"))
    assert len(await engine.receive_pdus([e.raw for e in events[:4]])) == 4
    before = await _count(engine)
    carol_join = orjson.loads(events[4].raw)

    def variant(signatures: Any) -> bytes:
        return orjson.dumps({**carol_join, "signatures": signatures})

    key_id = next(iter(carol_join["signatures"][REMOTE]))
    forged = "A" * 86  # the right length for an ed25519 signature, but not one
    cases = {
        "AAAA": variant({REMOTE: {key_id: "AAAA"}}),
        "forged": variant({REMOTE: {key_id: forged}}),
        "no signature": variant({}),
        "other server only": variant({"elsewhere.test": carol_join["signatures"][REMOTE]}),
        "unknown key": remote_event(
            OTHER_KEY,
            room_version("11"),
            events[0].room_id,
            CAROL,
            "m.room.member",
            {"membership": "join"},
            [events[3].event_id],
            events[4].auth_event_ids,
            5,
            state_key=CAROL,
        ).raw,
    }
    for name, raw in cases.items():
        # Refused as a whole batch, even next to a valid event.
        with pytest.raises(EventSignatureError) as info:
            await engine.receive_pdus([events[5].raw, raw])
        assert info.value.errcode == Codes.UNAUTHORIZED, name
        assert isinstance(info.value, BadEventError)
        assert REMOTE in info.value.message, name
    assert await _count(engine) == before
    # Only when the caller vouches for the input is an unverifiable event taken.
    (result,) = await engine.receive_pdus([cases["AAAA"]], trust_unsigned=True)
    assert result.rejected_reason is None


async def test_keys_added_by_an_operator_are_used_at_once(engine: RoomEngine) -> None:
    stranger = OTHER_KEY
    events = _remote_room(stranger, room_version("12"))
    with pytest.raises(EventSignatureError, match=r"keys known for remote\.test: ed25519:"):
        await engine.receive_pdus([e.raw for e in events])
    # Another process (``roomstream keys add``) stores the key in the same database.
    other = ServerKeyStore(engine.db)
    kid = f"ed25519:{stranger.version}"
    assert await other.add(REMOTE, kid, verify_key_base64(stranger))
    assert not await other.add(REMOTE, kid, verify_key_base64(stranger))  # idempotent
    with pytest.raises(ValueError, match="different key"):
        await other.add(REMOTE, kid, "A" * 43)
    results = await engine.receive_pdus([e.raw for e in events])
    assert all(r.rejected_reason is None for r in results)


@pytest.mark.parametrize("version", sorted(KNOWN_ROOM_VERSIONS))
async def test_content_hash_mismatch_is_redacted_then_processed(
    engine: RoomEngine, remote_key: SigningKey, version: str
) -> None:
    """The spec's check on receipt: an event whose content hash does not match is kept in
    its redacted form (the auth rules see the redacted copy), and the caller is told."""
    events = _remote_room(remote_key, room_version(version))
    carol_join, message = events[4], events[5]
    tampered_join = orjson.loads(carol_join.raw)
    tampered_join["content"] = {**tampered_join["content"], "displayname": "Mallory"}
    tampered_message = orjson.loads(message.raw)
    tampered_message["content"] = {"body": "changed in transit", "msgtype": "m.text"}
    raws = [e.raw for e in events[:4]]
    raws += [orjson.dumps(tampered_join), orjson.dumps(tampered_message)]
    results = await engine.receive_pdus(raws)
    assert [r.redacted_on_receipt for r in results] == [False] * 4 + [True, True]
    assert [r.event_id for r in results[4:]] == [carol_join.event_id, message.event_id]
    assert all(r.rejected_reason is None for r in results)
    # The membership survives redaction, so Carol is joined; the message is empty.
    room_id = room_id_for_create_event(events[0])
    current = await engine.store.get_current_state(room_id)
    assert current[("m.room.member", CAROL)] == carol_join.event_id
    stored_join = await engine.store.get_event(carol_join.event_id)
    assert stored_join is not None and dict(stored_join.content) == {"membership": "join"}
    stored_message = await engine.store.get_event(message.event_id)
    assert stored_message is not None and dict(stored_message.content) == {}
    # A tampered event whose signature does not verify is still refused.
    bad = orjson.loads(message.raw)
    bad["content"] = {"body": "x"}
    bad["signatures"] = {REMOTE: {k: "A" * 86 for k in bad["signatures"][REMOTE]}}
    with pytest.raises(EventSignatureError):
        await engine.receive_pdus([orjson.dumps(bad)])
