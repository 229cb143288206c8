"""Random rooms for the read-path tests, and a naive oracle of what each user may see.

A *script* is a list of moves played into a fresh room (joins, leaves, invites, kicks,
bans, unbans, history visibility changes, messages, redactions, forks, a redaction that
arrives before its target). Every event is built here with explicit prev and auth
events and handed to the persister as a received event, so the persister decides
rejection and soft failure as it would for another server's events.

The oracle (:class:`Oracle`) shares no code with ``roomstream.reading``: for each event
it reads the state before and after the event with ``EventStore.get_state_at`` and
applies the spec's history visibility rules literally (see :func:`spec_allows`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import strategies as st
from signedjson.types import SigningKey

from roomstream.errors import MatrixError
from roomstream.events.auth import auth_types_for_event
from roomstream.events.format import build_event_dict, finalise_local_event
from roomstream.events.model import Event
from roomstream.reading import EventsToken, RoomReader
from roomstream.rooms.creation import RoomPreset
from roomstream.rooms.engine import RoomEngine

SERVER = "read.test"
NAMES = ("alice", "bob", "carol", "dave", "eve")  # alice creates; eve never acts
ACTORS = ("bob", "carol", "dave")
HV_VALUES = ("world_readable", "shared", "invited", "joined", "bogus")

Move = tuple[Any, ...]

moves = st.one_of(
    st.tuples(st.sampled_from(["join", "leave", "invite", "kick", "ban", "unban"]),
              st.sampled_from(ACTORS)),
    st.tuples(st.just("hv"), st.sampled_from(HV_VALUES)),
    st.tuples(st.just("message"), st.sampled_from(("alice", *ACTORS))),
    st.tuples(st.just("redact"), st.integers(0, 50)),
    st.tuples(
        st.just("fork"),
        st.sampled_from(("alice", *ACTORS)),
        st.sampled_from(["message", "join", "leave", "hv"]),
        st.integers(0, 4),
        st.sampled_from(HV_VALUES),
    ),
    st.tuples(st.just("early_redaction")),
    st.tuples(
        st.just("late_chain"),
        st.sampled_from(ACTORS),
        st.sampled_from(["join", "leave"]),
        st.integers(0, 3),
        st.integers(1, 3),
    ),
)  # fmt: skip
scripts = st.lists(moves, min_size=2, max_size=22)


@dataclass
class PlayedRoom:
    room_id: str
    users: dict[str, str]  # short name -> user ID
    #: (token, number of stored events at that time), taken after each move.
    tokens: list[EventsToken] = field(default_factory=list)


class Player:
    """Plays scripts into rooms of one engine; each room gets fresh user IDs."""

    def __init__(self, engine: RoomEngine, key: SigningKey) -> None:
        self.engine = engine
        self.key = key
        self.rooms = 0

    async def send(
        self,
        room_id: str,
        sender: str,
        event_type: str,
        content: dict[str, Any],
        *,
        state_key: str | None = None,
        prevs: Sequence[str] | None = None,
        redacts: str | None = None,
        persist: bool = True,
    ) -> Event:
        persister, store = self.engine.persister, self.engine.store
        version, extremities, current = await persister.get_room_state(room_id)
        if prevs is None:
            prevs, state = sorted(extremities), current
        else:
            state = await store.get_state_at(prevs[0])
        keys = auth_types_for_event(version, event_type, state_key, sender, content)
        auth = [state[k] for k in keys if k in state]
        prev_events = await persister.get_events(prevs)
        depth = max(e.depth for e in prev_events.values()) + 1
        event = finalise_local_event(
            build_event_dict(
                version,
                event_type=event_type,
                sender=sender,
                content=content,
                prev_events=list(prevs),
                auth_events=auth,
                depth=depth,
                room_id=room_id,
                state_key=state_key,
                redacts=redacts,
            ),
            version,
            SERVER,
            self.key,
        )
        if persist:
            await persister.persist_events([event])
        return event

    async def play(self, script: Sequence[Move], version: str = "12") -> PlayedRoom:
        self.rooms += 1
        users = {n: f"@{n}{self.rooms}:{SERVER}" for n in NAMES}
        alice = users["alice"]
        room_id, _ = await self.engine.creator.create_room(
            alice, version=version, preset=RoomPreset.PUBLIC_CHAT, name="r"
        )
        played = PlayedRoom(room_id, users)
        played.tokens.append(await _token(self.engine))
        messages: list[str] = []
        timeline: list[str] = []  # events that made it into the timeline, in order
        late: list[tuple[int, list[Event]]] = []  # (moves to wait, events) not yet sent

        async def note(event: Event) -> None:
            meta = (await self.engine.store.get_meta([event.event_id]))[event.event_id]
            if not (meta.outlier or meta.rejected_reason or meta.soft_failed):
                timeline.append(event.event_id)

        async def deliver(due: bool) -> None:
            nonlocal late
            keep = []
            for wait, events in late:
                if wait <= 1 or not due:
                    await self.engine.persister.persist_events(events)
                    for e in events:
                        await note(e)
                else:
                    keep.append((wait - 1, events))
            late = keep

        for move in script:
            kind = move[0]
            event: Event | None = None
            if kind in ("join", "leave"):
                user = users[move[1]]
                event = await self.send(
                    room_id, user, "m.room.member", {"membership": kind}, state_key=user
                )
            elif kind in ("invite", "kick", "ban", "unban"):
                membership = {"invite": "invite", "kick": "leave", "ban": "ban", "unban": "leave"}
                user = users[move[1]]
                event = await self.send(
                    room_id,
                    alice,
                    "m.room.member",
                    {"membership": membership[kind]},
                    state_key=user,
                )
            elif kind == "hv":
                event = await self.send(
                    room_id,
                    alice,
                    "m.room.history_visibility",
                    {"history_visibility": move[1]},
                    state_key="",
                )
            elif kind == "message":
                event = await self.send(
                    room_id,
                    users[move[1]],
                    "m.room.message",
                    {"msgtype": "m.text", "body": f"m{len(messages)}"},
                )
                messages.append(event.event_id)
            elif kind == "redact" and messages:
                target = messages[move[1] % len(messages)]
                event = await self.send(room_id, alice, "m.room.redaction", {}, redacts=target)
            elif kind == "fork" and timeline:
                _, who, what, back, value = move
                prev = timeline[max(0, len(timeline) - 1 - back)]
                sender = users[who]
                if what == "message":
                    event = await self.send(
                        room_id, sender, "m.room.message", {"body": "fork"}, prevs=[prev]
                    )
                    messages.append(event.event_id)
                elif what in ("join", "leave"):
                    event = await self.send(
                        room_id,
                        sender,
                        "m.room.member",
                        {"membership": what},
                        state_key=sender,
                        prevs=[prev],
                    )
                else:
                    event = await self.send(
                        room_id,
                        alice,
                        "m.room.history_visibility",
                        {"history_visibility": value},
                        state_key="",
                        prevs=[prev],
                    )
            elif kind == "early_redaction":
                message = await self.send(
                    room_id, alice, "m.room.message", {"body": "early"}, persist=False
                )
                await self.send(room_id, alice, "m.room.redaction", {}, redacts=message.event_id)
                await self.engine.persister.persist_events([message])
                messages.append(message.event_id)
                event = message
            elif kind == "late_chain" and timeline:
                # A membership change and a message on it, built on an older event now
                # and delivered a few moves later (as from a slow server): they land
                # in the middle of the room's topological order.
                _, who, what, back, wait = move
                prev = timeline[max(0, len(timeline) - 1 - back)]
                sender = users[who]
                first = await self.send(
                    room_id,
                    sender,
                    "m.room.member",
                    {"membership": what},
                    state_key=sender,
                    prevs=[prev],
                    persist=False,
                )
                second = await self._build_on(room_id, first, users["alice"])
                late.append((wait, [first, second]))
            if event is not None:
                await note(event)
            await deliver(due=True)
            played.tokens.append(await _token(self.engine))
        await deliver(due=False)
        played.tokens.append(await _token(self.engine))
        return played

    async def _build_on(self, room_id: str, parent: Event, sender: str) -> Event:
        """A message by ``sender`` whose only prev event is ``parent`` (not yet stored)."""
        version, _, _ = await self.engine.persister.get_room_state(room_id)
        state = await self.engine.store.get_state_at(parent.prev_event_ids[0])
        state = {**state, parent.state_tuple: parent.event_id} if parent.is_state() else state
        keys = auth_types_for_event(version, "m.room.message", None, sender, {})
        return finalise_local_event(
            build_event_dict(
                version,
                event_type="m.room.message",
                sender=sender,
                content={"body": "late"},
                prev_events=[parent.event_id],
                auth_events=[state[k] for k in keys if k in state],
                depth=parent.depth + 1,
                room_id=room_id,
            ),
            version,
            SERVER,
            self.key,
        )


async def _token(engine: RoomEngine) -> EventsToken:
    generator = engine.streams.generator("events")
    return EventsToken.from_positions(generator.get_positions())


# -- the oracle ------------------------------------------------------------------------


def spec_allows(history_visibility: str, membership: str | None, joined_later: bool) -> bool:
    """The spec's algorithm, steps 1-5, for one event and one user."""
    if history_visibility == "world_readable":
        return True
    if membership == "join":
        return True
    if history_visibility == "shared" and joined_later:
        return True
    return history_visibility == "invited" and membership == "invite"


@dataclass(frozen=True)
class OracleEvent:
    event: Event
    topological: int
    stream: int
    hv_before: str
    hv_after: str
    members_before: dict[str, str | None]
    redacted_by: str | None

    @property
    def position(self) -> tuple[int, int]:
        return (self.topological, self.stream)


class Oracle:
    """What each user may see of one room, from the state at each event."""

    def __init__(self, events: list[OracleEvent], own: dict[str, list[tuple[int, Event]]]):
        self.events = sorted(events, key=lambda e: e.position)
        self.own_membership_events = own  # user -> [(stream, event)] not rejected/soft-failed

    @classmethod
    async def build(cls, engine: RoomEngine, played: PlayedRoom) -> Oracle:
        rows = await engine.db.run_interaction(
            "test_query",
            lambda t: t.query(
                "SELECT event_id, topological_ordering, stream_ordering, outlier,"
                " rejected_reason, soft_failed FROM events WHERE room_id = ?",
                (played.room_id,),
            ),
        )
        stored = await engine.store.get_events([r[0] for r in rows])
        everything = dict(stored)

        async def content_of(event_id: str | None) -> dict[str, Any]:
            if event_id is None:
                return {}
            if event_id not in everything:
                everything.update(await engine.store.get_events([event_id]))
            return dict(everything[event_id].content)

        async def hv_of(state: dict[tuple[str, str], str]) -> str:
            value = (await content_of(state.get(("m.room.history_visibility", "")))).get(
                "history_visibility"
            )
            return value if value in ("world_readable", "shared", "invited", "joined") else "shared"

        accepted_redactions: dict[str, str] = {}
        for r in rows:
            event = stored[r[0]]
            if event.type == "m.room.redaction" and r[4] is None:
                target = event.content.get("redacts") or event.data.get("redacts")
                accepted_redactions.setdefault(str(target), event.event_id)
        result = []
        own: dict[str, list[tuple[int, Event]]] = {}
        for event_id, topo, stream, outlier, rejected, soft_failed in rows:
            event = stored[event_id]
            if rejected is None and not soft_failed and event.type == "m.room.member":
                own.setdefault(str(event.state_key), []).append((int(stream), event))
            if outlier or rejected is not None or soft_failed:
                continue
            before = await engine.store.get_state_at(event_id, before=True)
            after = await engine.store.get_state_at(event_id)
            members = {}
            for user in played.users.values():
                member = before.get(("m.room.member", user))
                members[user] = (await content_of(member)).get("membership") if member else None
            result.append(
                OracleEvent(
                    event,
                    int(topo),
                    int(stream),
                    await hv_of(before),
                    await hv_of(after),
                    members,
                    accepted_redactions.get(event_id),
                )
            )
        for events in own.values():
            events.sort(key=lambda pair: pair[0])
        return cls(result, own)

    def joined_later(self, user: str, event: OracleEvent) -> bool:
        return any(
            e.event.type == "m.room.member"
            and e.event.state_key == user
            and e.event.content.get("membership") == "join"
            and e.position > event.position
            for e in self.events
        )

    def may_see(self, user: str, e: OracleEvent) -> bool:
        later = self.joined_later(user, e)
        membership = e.members_before[user]
        if spec_allows(e.hv_before, membership, later):
            return True
        # The visibility event itself: before or after.
        is_visibility_event = e.event.type == "m.room.history_visibility"
        if is_visibility_event and spec_allows(e.hv_after, membership, later):
            return True
        # The user's own membership event: membership before or after.
        if e.event.type == "m.room.member" and e.event.state_key == user:
            return spec_allows(e.hv_before, e.event.content.get("membership"), later)
        return False

    def visible(self, user: str) -> list[OracleEvent]:
        """Events the user may see, in topological order."""
        return [e for e in self.events if self.may_see(user, e)]


#: Memberships of a user who left a room.
LEFT = ("leave", "ban")


async def check_room(engine: RoomEngine, reader: RoomReader, played: PlayedRoom) -> None:
    oracle = await Oracle.build(engine, played)
    room_id = played.room_id
    current = await engine.store.get_current_state(room_id)
    for user in played.users.values():
        visible = oracle.visible(user)
        ids = [e.event.event_id for e in visible]
        # Back pagination, pages of 3.
        seen: list[str] = []
        token = None
        while True:
            chunk = await reader.paginate(user, room_id, token, direction="b", limit=3)
            seen.extend(e["event_id"] for e in chunk.events)
            if chunk.end is None:
                break
            token = chunk.end
        assert seen == list(reversed(ids)), f"back pagination for {user}"
        # Forward pagination, pages of 4.
        seen = []
        token = None
        while True:
            chunk = await reader.paginate(user, room_id, token, direction="f", limit=4)
            seen.extend(e["event_id"] for e in chunk.events)
            if chunk.end is None:
                break
            token = chunk.end
        assert seen == ids, f"forward pagination for {user}"
        # The latest events (sliding sync's read), and back pagination from its prev_batch.
        for limit in (1, 3):
            page = (await reader.latest_pages(user, [room_id], limit=limit))[room_id]
            assert [e["event_id"] for e in page.events] == ids[-limit:], f"latest for {user}"
            assert page.limited == (len(ids) > limit)
            older = await reader.paginate(user, room_id, page.prev_batch, limit=1000)
            assert [e["event_id"] for e in older.events] == list(reversed(ids[:-limit]))

        # Sync from each token.
        membership_id = current.get(("m.room.member", user))
        membership = None
        if membership_id is not None:
            membership = (await engine.store.get_event(membership_id)).content.get(  # type: ignore[union-attr]
                "membership"
            )
        own = oracle.own_membership_events.get(user, [])
        by_id = {e.event.event_id: e for e in oracle.events}
        for since in played.tokens:
            position = since.position("main")
            own_events = [ev for s, ev in own if s > position]
            own_since = [ev.event_id for ev in own_events]
            # Joined since the token (a join from another membership): the latest
            # visible events, as an initial sync reads them (topological order).
            newly_joined = membership == "join" and any(
                ev.content.get("membership") == "join"
                and (ev.event_id not in by_id or by_id[ev.event_id].members_before[user] != "join")
                for ev in own_events
            )
            # Left since the token: nothing after the last leave or ban.
            leaves = [s for s, ev in own if s > position and ev.content.get("membership") in LEFT]
            stop = leaves[-1] if membership in LEFT and leaves else None
            if newly_joined:
                expected = list(visible)
            else:
                expected = sorted(
                    (
                        e
                        for e in visible
                        if e.stream > position and (stop is None or e.stream <= stop)
                    ),
                    key=lambda e: e.stream,
                )
            for limit in (100, 2):
                result = await reader.sync(user, since, timeline_limit=limit)
                assert [e["event_id"] for e in result.membership_changes] == own_since
                room = result.rooms.get(room_id)
                if room is None:
                    assert not own_since
                    assert membership != "join" or not expected, f"sync for {user} missed"
                    continue
                want = [e.event.event_id for e in expected][-limit:]
                assert [e["event_id"] for e in room.events] == want, f"sync for {user}"
                assert room.limited == (len(expected) > limit)

        # Latest rooms.
        page = await reader.latest_rooms(user, room_limit=5, event_limit=3, state="none")
        by_room = {r.room_id: r for r in page.rooms}
        if membership == "join":
            timeline = by_room[room_id]
            assert [e["event_id"] for e in timeline.events] == ids[-3:], f"latest for {user}"
            assert timeline.limited == (len(ids) > 3)
        elif membership in LEFT:
            # Up to the user's leave (their membership event), none after it.
            left_at = by_id.get(str(membership_id))
            upto = (
                [] if left_at is None else [e for e in ids if by_id[e].position <= left_at.position]
            )
            timeline = by_room[room_id]
            assert [e["event_id"] for e in timeline.events] == upto[-3:], f"latest for {user}"
            assert timeline.limited == (len(upto) > 3)
        elif membership == "invite":
            assert by_room[room_id].events == []
        else:
            assert room_id not in by_room

        # Context, single events, redactions.
        allowed = set(ids)
        for index, e in enumerate(oracle.events):
            event_id = e.event.event_id
            served = await reader.get_event(user, event_id)
            if event_id not in allowed:
                assert served is None, f"{user} may not see {event_id}"
                with pytest.raises(MatrixError):
                    await reader.context(user, room_id, event_id, before=2, after=2)
                continue
            assert served is not None
            if e.redacted_by is not None:
                assert served["unsigned"]["redacted_because"]["event_id"] == e.redacted_by
                if e.event.type == "m.room.message":
                    assert served["content"] == {}
            else:
                assert "redacted_because" not in served.get("unsigned", {})
                assert served["content"] == e.event.content
            if index % 3 == 0:
                context = await reader.context(user, room_id, event_id, before=2, after=2)
                at = ids.index(event_id)
                assert [x["event_id"] for x in context.events_before] == list(
                    reversed(ids[max(0, at - 2) : at])
                )
                assert [x["event_id"] for x in context.events_after] == ids[at + 1 : at + 3]


#: Scripts that between them exercise every rule and edge case.
FIXED: list[tuple[list[Move], str]] = [
    (  # shared history seen by later joiners; joined visibility hides it
        [("message", "alice"), ("join", "bob"), ("message", "bob"), ("hv", "joined"),
         ("message", "alice"), ("leave", "bob"), ("message", "alice"), ("join", "carol"),
         ("message", "carol")],
        "12",
    ),
    (  # shared history after a member left is not theirs
        [("join", "bob"), ("message", "bob"), ("leave", "bob"), ("message", "alice"),
         ("invite", "carol"), ("message", "alice")],
        "11",
    ),
    (  # invited visibility, invites, kicks, bans, rejoin
        [("hv", "invited"), ("invite", "bob"), ("message", "alice"), ("join", "bob"),
         ("message", "bob"), ("kick", "bob"), ("message", "alice"), ("join", "bob"),
         ("ban", "carol"), ("message", "alice"), ("invite", "dave"), ("message", "alice")],
        "10",
    ),
    (  # world_readable for people who never joined; visibility changes back and forth
        [("hv", "world_readable"), ("message", "alice"), ("hv", "joined"),
         ("message", "alice"), ("hv", "world_readable"), ("join", "dave"),
         ("leave", "dave"), ("message", "alice")],
        "12",
    ),
    (  # own membership events under joined visibility; forks
        [("hv", "joined"), ("invite", "carol"), ("join", "carol"), ("message", "carol"),
         ("leave", "carol"), ("fork", "alice", "message", 2, "shared"),
         ("fork", "alice", "hv", 1, "world_readable"), ("message", "alice"),
         ("join", "bob"), ("redact", 0), ("early_redaction",)],
        "12",
    ),
    (  # a late chain lands in the middle: the membership it carries ends where it ends
        [("message", "alice"), ("message", "alice"), ("message", "alice"),
         ("late_chain", "bob", "join", 2, 3), ("message", "alice"), ("message", "alice"),
         ("message", "alice"), ("message", "bob"), ("hv", "joined"),
         ("late_chain", "carol", "join", 1, 2), ("message", "alice"), ("message", "alice"),
         ("message", "carol")],
        "12",
    ),
]  # fmt: skip
