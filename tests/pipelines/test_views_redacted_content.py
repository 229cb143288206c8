"""The views read event content the way clients see it: an event whose redaction applied
is read in its redacted form (issue 17 §1, "the views"), so a redacted display name never
reaches the user directory; a redaction that did not apply changes nothing. No Spark:
the content lookup runs on the driver, in a database transaction."""

from __future__ import annotations

from pathlib import Path

from roomstream.events.signing import load_or_create_signing_key
from roomstream.pipelines.views import EventJsonContentLookup
from roomstream.reading import read_side_participants
from roomstream.rooms.creation import RoomPreset
from roomstream.rooms.engine import RoomEngine
from roomstream.storage import Database
from roomstream.streams import StreamSet

SERVER = "views.test"
ALICE, BOB = f"@alice:{SERVER}", f"@bob:{SERVER}"


async def test_redacted_member_events_are_read_redacted(database: Database, tmp_path: Path) -> None:
    streams = await StreamSet.open(database, "main", {})
    key = load_or_create_signing_key(tmp_path / "keys", SERVER)
    engine = RoomEngine(
        database, streams, SERVER, "main", key, participants=read_side_participants()
    )
    room_id, _ = await engine.creator.create_room(ALICE, preset=RoomPreset.PUBLIC_CHAT)
    joined = await engine.creator.create_event(
        room_id,
        BOB,
        "m.room.member",
        {"membership": "join", "displayname": "Bob B"},
        state_key=BOB,
    )
    renamed = await engine.creator.create_event(
        room_id,
        ALICE,
        "m.room.member",
        {"membership": "join", "displayname": "Secret A"},
        state_key=ALICE,
    )
    kept = await engine.creator.create_event(
        room_id,
        ALICE,
        "m.room.member",
        {"membership": "join", "displayname": "Alice"},
        state_key=ALICE,
    )
    # Alice redacts her own earlier member event (applies: her own event).
    await engine.creator.create_event(
        room_id,
        ALICE,
        "m.room.redaction",
        {"redacts": renamed.event.event_id},
        redacts=renamed.event.event_id,
    )
    ids = [e.event.event_id for e in (joined, renamed, kept)]
    contents = await database.run_interaction(
        "test_query", EventJsonContentLookup().get_contents, ids
    )
    assert contents[joined.event.event_id] == {"membership": "join", "displayname": "Bob B"}
    assert contents[renamed.event.event_id] == {"membership": "join"}  # redacted form
    assert contents[kept.event.event_id]["displayname"] == "Alice"
