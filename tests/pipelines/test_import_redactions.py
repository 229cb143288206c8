"""The Spark import applies redactions by the same rule as the online path
(``redaction_applies``): a redaction by a member without the redact level of someone
else's event is stored and never applied, and none applies across rooms."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from signedjson.key import generate_signing_key

from roomstream.events.auth import auth_types_for_event
from roomstream.events.format import build_event_dict, finalise_local_event
from roomstream.events.model import Event
from roomstream.events.room_versions import room_version
from roomstream.pipelines.importer import import_events
from roomstream.storage import DatabaseConfig, connect

pytestmark = pytest.mark.spark

VERSION = room_version("11")
#: The importing server, and another one.
LOCAL, OTHER = "s0.test", "s1.test"
ALICE, BOB, CAROL = f"@alice:{LOCAL}", f"@bob:{LOCAL}", f"@carol:{OTHER}"
KEYS = {LOCAL: generate_signing_key("a"), OTHER: generate_signing_key("b")}


class RoomLog:
    """A linear room history built as its senders' servers would sign it."""

    def __init__(self, room_id: str) -> None:
        self.room_id = room_id
        self.events: list[Event] = []
        self.state: dict[tuple[str, str], str] = {}

    def add(
        self,
        sender: str,
        event_type: str,
        content: dict[str, Any],
        state_key: str | None = None,
    ) -> str:
        keys = auth_types_for_event(VERSION, event_type, state_key, sender, content)
        server = sender.partition(":")[2]
        event = finalise_local_event(
            build_event_dict(
                VERSION,
                event_type=event_type,
                sender=sender,
                content=content,
                prev_events=[self.events[-1].event_id] if self.events else [],
                auth_events=[self.state[k] for k in keys if k in self.state],
                depth=len(self.events) + 1,
                room_id=self.room_id,
                state_key=state_key,
            ),
            VERSION,
            server,
            KEYS[server],
        )
        self.events.append(event)
        if state_key is not None:
            self.state[(event_type, state_key)] = event.event_id
        return event.event_id

    def public_room_with(self, *members: str) -> None:
        self.add(ALICE, "m.room.create", {"room_version": "11"}, "")
        self.add(ALICE, "m.room.member", {"membership": "join"}, ALICE)
        self.add(ALICE, "m.room.power_levels", {"users": {ALICE: 100}}, "")
        self.add(ALICE, "m.room.join_rules", {"join_rule": "public"}, "")
        for member in members:
            self.add(member, "m.room.member", {"membership": "join"}, member)

    def say(self, sender: str) -> str:
        return self.add(sender, "m.room.message", {"msgtype": "m.text", "body": "hi"})

    def redact(self, sender: str, target: str) -> str:
        return self.add(sender, "m.room.redaction", {"redacts": target})


def test_import_applies_only_authorised_redactions(spark: SparkSession, tmp_path: Path) -> None:
    room, other = RoomLog(f"!one:{LOCAL}"), RoomLog(f"!two:{LOCAL}")
    room.public_room_with(BOB, CAROL)
    other.public_room_with(BOB)
    alices, bobs, carols = room.say(ALICE), room.say(BOB), room.say(CAROL)
    # Refused: same server but ours, so exact (Bob, level 0, of Alice's); another server
    # (Carol of Bob's); another room (Alice, level 100 in both, from the other room).
    refused = [
        room.redact(BOB, alices),
        room.redact(CAROL, bobs),
        other.redact(ALICE, carols),
        other.redact(BOB, bobs),
    ]
    by_alice = room.redact(ALICE, carols)  # the redact level
    own = room.say(CAROL)
    by_carol = room.redact(CAROL, own)  # her own
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(b"".join(e.raw + b"\n" for e in [*room.events, *other.events]))

    target = DatabaseConfig(engine="sqlite", path=str(tmp_path / "target.db"))
    report = import_events(
        path, target, spark=spark, partitions=2, trust_unsigned=True, server_name=LOCAL
    )
    assert report.events == len(room.events) + len(other.events)
    assert report.rejected == 0 and report.invalid == 0
    db = connect(target)
    try:
        rows = db.run_interaction_blocking(
            "test_query",
            lambda t: t.query("SELECT event_id, redacted_by, rejected_reason FROM events"),
        )
    finally:
        db.close_blocking()
    redacted = {str(e): r for e, r, _ in rows if r is not None}
    assert redacted == {carols: by_alice, own: by_carol}
    stored = {str(e) for e, _, rejected in rows if rejected is None}
    assert set(refused) <= stored  # stored, accepted, not applied
