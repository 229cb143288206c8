"""A room's event DAG written out by hand (:class:`RoomDag`, events :class:`E`) with the
spec's example users and initial state, for the state resolution tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from roomstream.events.auth import auth_types_for_event, check_auth_rules
from roomstream.events.hashing import compute_event_id
from roomstream.events.model import Event, StateKey
from roomstream.events.room_versions import RoomVersion
from roomstream.state.resolution import (
    InMemoryStateResolutionStore,
    resolve_state,
)

ALICE = "@alice:example.com"


BOB = "@bob:example.com"


CHARLIE = "@charlie:example.com"


EVELYN = "@evelyn:example.com"


ZARA = "@zara:example.com"


CREATE = "m.room.create"


MEMBER = "m.room.member"


POWER_LEVELS = "m.room.power_levels"


JOIN_RULES = "m.room.join_rules"


TOPIC = "m.room.topic"


MESSAGE = "m.room.message"


@dataclass(frozen=True)
class E:
    """An event of a scenario, before it is placed in the DAG."""

    name: str
    sender: str
    type: str
    state_key: str | None = None
    content: Mapping[str, Any] = field(default_factory=dict)


def member(name: str, sender: str, target: str, membership: str) -> E:
    return E(name, sender, MEMBER, target, {"membership": membership})


def power_levels(name: str, sender: str, users: Mapping[str, int], **extra: Any) -> E:
    return E(name, sender, POWER_LEVELS, "", {"users": dict(users), **extra})


def topic(name: str, sender: str, text: str | None = None) -> E:
    return E(name, sender, TOPIC, "", {"topic": text or name})


INITIAL_EVENTS = [
    E("CREATE", ALICE, CREATE, ""),
    member("IMA", ALICE, ALICE, "join"),
    power_levels("IPOWER", ALICE, {ALICE: 100}),
    E("IJR", ALICE, JOIN_RULES, "", {"join_rule": "public"}),
    member("IMB", BOB, BOB, "join"),
    member("IMC", CHARLIE, CHARLIE, "join"),
    member("IMZ", ZARA, ZARA, "join"),
    E("START", ZARA, MESSAGE, None, {"body": "start"}),
]


INITIAL_EDGES = [["START", "IMZ", "IMC", "IMB", "IJR", "IPOWER", "IMA", "CREATE"]]


END = E("END", ZARA, MESSAGE, None, {"body": "end"})


class RoomDag:
    """Builds a room DAG event by event, tracking the state after every event.

    Event IDs are readable (``$NAME``) unless ``hashed_ids``: then, from room version 3,
    they are the real reference hashes (and v12's room ID the create event's), so that
    another implementation computing IDs from the events (Synapse) agrees with them.
    """

    def __init__(self, version: RoomVersion, *, hashed_ids: bool = False) -> None:
        self.version = version
        self.hashed_ids = hashed_ids and not version.event_ids_in_pdu
        self._ids: dict[str, str] = {}
        self._names: dict[str, str] = {}
        self.store = InMemoryStateResolutionStore()
        self.room_id = "!CREATE" if version.room_id_from_create_event else "!room:example.com"
        self.events: dict[str, Event] = {}
        self.state_after: dict[str, dict[StateKey, str]] = {}
        self.ts = 1_000

    def event_id(self, name: str) -> str:
        return self._ids.get(name, f"${name}")

    def adapt_content(self, spec: E) -> dict[str, Any]:
        content = dict(spec.content)
        if spec.type == CREATE:
            content["room_version"] = self.version.identifier
            if not self.version.implicit_room_creator:
                content["creator"] = spec.sender
        if spec.type == POWER_LEVELS and self.version.privileged_creators:
            # v12 (MSC4289): creators are not listed; they have infinite power anyway.
            users = {u: v for u, v in content.get("users", {}).items() if u != ALICE}
            content["users"] = users
        return content

    async def state_before(self, prev_names: Sequence[str]) -> dict[StateKey, str]:
        if not prev_names:
            return {}
        states = [self.state_after[p] for p in prev_names]
        if len(states) == 1:
            return dict(states[0])
        return await resolve_state(self.room_id, self.version, states, self.store)

    async def add(self, spec: E, prev_names: Sequence[str], *, check: bool = True) -> Event:
        """Place ``spec`` after ``prev_names``; it must be allowed at its state."""
        before = await self.state_before(prev_names)
        content = self.adapt_content(spec)
        keys = auth_types_for_event(self.version, spec.type, spec.state_key, spec.sender, content)
        self.ts += 1
        data: dict[str, Any] = {
            "type": spec.type,
            "sender": spec.sender,
            "content": content,
            "prev_events": [self.event_id(p) for p in prev_names],
            "auth_events": [before[k] for k in keys if k in before],
            "origin_server_ts": self.ts,
            "depth": 1 + max((self.events[p].depth for p in prev_names), default=0),
        }
        if spec.state_key is not None:
            data["state_key"] = spec.state_key
        if self.version.event_ids_in_pdu:
            # Room versions 1 and 2: the ID is in the PDU, references are pairs.
            data["event_id"] = self.event_id(spec.name)
            data["prev_events"] = [[e, {}] for e in data["prev_events"]]
            data["auth_events"] = [[e, {}] for e in data["auth_events"]]
        if not (spec.type == CREATE and self.version.room_id_from_create_event):
            data["room_id"] = self.room_id
        if self.hashed_ids:
            data["hashes"] = {"sha256": ""}
            data["signatures"] = {}
            self._ids[spec.name] = compute_event_id(data, self.version)
            self._names[self._ids[spec.name]] = spec.name
            if spec.type == CREATE and self.version.room_id_from_create_event:
                self.room_id = "!" + self._ids[spec.name][1:]
        event = Event(data, self.version, self.event_id(spec.name))

        if check:
            auth_state = {k: self.store_event(before[k]) for k in keys if k in before}
            if spec.type != CREATE:
                auth_state[(CREATE, "")] = self.store_event(before[(CREATE, "")])
            check_auth_rules(event, auth_state)

        self.store.add_event(event)
        self.events[spec.name] = event
        after = dict(before)
        if event.is_state():
            after[event.state_tuple] = event.event_id
        self.state_after[spec.name] = after
        return event

    def store_event(self, event_id: str) -> Event:
        return self.events[self._names.get(event_id, event_id[1:])]
