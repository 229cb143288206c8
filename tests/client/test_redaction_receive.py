"""Redactions that reach the engine as received events (the import's and federation's
path), where no client-API check ran: the auth rules accept them, they are stored, and
they apply only if ``redaction_applies`` says so -- checked on what clients are served
(/sync, /messages, /event), on both engines, also when the redaction arrives first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from signedjson.types import SigningKey

from roomstream.events.auth import auth_types_for_event
from roomstream.events.format import build_event_dict, finalise_local_event
from roomstream.events.model import Event
from roomstream.events.signing import load_or_create_signing_key
from tests.support.homeserver import SERVER_NAME, Homeserver
from tests.support.redaction import BODY, intact, public_room, redacted_by, send, served

REMOTE = "remote.test"
CAROL = f"@carol:{REMOTE}"
DAVE = f"@dave:{REMOTE}"


async def made_by(
    hs: Homeserver,
    key: SigningKey,
    room_id: str,
    sender: str,
    event_type: str,
    content: dict[str, Any],
    *,
    state_key: str | None = None,
    redacts: str | None = None,
) -> Event:
    """An event as ``sender``'s server (signing with ``key``) would make it, on the room's
    current extremities and state, with no check of whether it is allowed."""
    version, extremities, current = await hs.engine.persister.get_room_state(room_id)
    prev = await hs.engine.persister.get_events(extremities)
    keys = auth_types_for_event(version, event_type, state_key, sender, content)
    server = sender.partition(":")[2]
    return finalise_local_event(
        build_event_dict(
            version,
            event_type=event_type,
            sender=sender,
            content=content,
            prev_events=sorted(extremities),
            auth_events=[current[k] for k in keys if k in current],
            depth=max(e.depth for e in prev.values()) + 1,
            room_id=room_id,
            state_key=state_key,
            redacts=redacts,
        ),
        version,
        server,
        key,
    )


async def receive(hs: Homeserver, *events: Event) -> None:
    """Persist as received from another server, one at a time, in the order given."""
    for event in events:
        (result,) = await hs.engine.receive_pdus([event.raw], trust_unsigned=True)
        assert result.rejected_reason is None and not result.soft_failed, result
        assert result.new and not result.outlier


async def test_received_unauthorised_local_redaction_is_stored_not_applied(
    homeserver: Homeserver,
) -> None:
    hs = homeserver
    alice, bob = await hs.register("alice"), await hs.register("bob")
    room_id = await public_room(hs, alice, bob)
    message = await send(hs, alice, room_id)
    own = hs.engine.creator.signing_key
    redaction = await made_by(
        hs, own, room_id, bob.user_id, "m.room.redaction", {}, redacts=message
    )
    await receive(hs, redaction)
    meta = await hs.engine.store.get_meta([message, redaction.event_id])
    assert meta[redaction.event_id].rejected_reason is None  # stored, accepted...
    assert meta[message].redacted_by is None  # ...and not applied
    for user in (alice, bob):
        assert intact(await served(hs, user, room_id, message))


async def test_a_redaction_received_before_its_target(homeserver: Homeserver) -> None:
    """Stored first, judged when the target arrives (by the state at the redaction)."""
    hs = homeserver
    alice, bob = await hs.register("alice"), await hs.register("bob")
    room_id = await public_room(hs, alice, bob)
    own = hs.engine.creator.signing_key
    alices = await made_by(hs, own, room_id, alice.user_id, "m.room.message", BODY)
    bobs = await made_by(hs, own, room_id, bob.user_id, "m.room.message", BODY)
    by_bob = await made_by(
        hs, own, room_id, bob.user_id, "m.room.redaction", {}, redacts=alices.event_id
    )
    by_alice = await made_by(
        hs, own, room_id, alice.user_id, "m.room.redaction", {}, redacts=bobs.event_id
    )
    # All four on the same prev events: the redactions first, then their targets.
    await receive(hs, by_bob, by_alice, alices, bobs)
    for user in (alice, bob):
        assert intact(await served(hs, user, room_id, alices.event_id))
        assert redacted_by(await served(hs, user, room_id, bobs.event_id), by_alice.event_id)


async def test_received_remote_redactions_follow_the_server_rule(
    homeserver: Homeserver, tmp_path: Path
) -> None:
    """A remote server vouches for its own users (the spec's rule): Carol may redact
    Dave's message (same server), not Alice's (ours)."""
    hs = homeserver
    alice, bob = await hs.register("alice"), await hs.register("bob")
    room_id = await public_room(hs, alice, bob)
    remote = load_or_create_signing_key(tmp_path / "remote", REMOTE)
    for user in (CAROL, DAVE):
        join = await made_by(
            hs, remote, room_id, user, "m.room.member", {"membership": "join"}, state_key=user
        )
        await receive(hs, join)
    daves = await made_by(hs, remote, room_id, DAVE, "m.room.message", BODY)
    await receive(hs, daves)
    alices = await send(hs, alice, room_id)
    of_alices = await made_by(hs, remote, room_id, CAROL, "m.room.redaction", {}, redacts=alices)
    await receive(hs, of_alices)
    of_daves = await made_by(
        hs, remote, room_id, CAROL, "m.room.redaction", {}, redacts=daves.event_id
    )
    await receive(hs, of_daves)
    for user in (alice, bob):
        assert intact(await served(hs, user, room_id, alices))
        assert redacted_by(await served(hs, user, room_id, daves.event_id), of_daves.event_id)
    assert SERVER_NAME != REMOTE
