"""A generator of realistic room histories: federation PDUs as JSON lines.

``roomstream generate`` writes one signed PDU per line (canonical JSON, exactly the bytes a
remote server would send), produced with :func:`~roomstream.events.format.build_event_dict`
and :func:`~roomstream.events.format.finalise_local_event` as several fake remote servers,
each with its own ed25519 key. The histories have:

- many rooms whose sizes follow a heavy-tailed (Pareto) distribution, capped;
- room versions 10, 11 and 12 mixed;
- membership churn (joins, leaves, invites, kicks, bans, unbans), power level changes,
  topic and name changes, redactions (some messages redacted twice) and messages;
- concurrent branches: a *fork* is two or three branches that share the same prev event,
  merged later by one event listing every branch tip in ``prev_events``;
- events the auth rules must reject (non-members speaking, unprivileged state changes and
  kicks, banned users speaking, non-state auth events); these are leaves: nothing lists a
  rejected event as a prev event;
- events a receiving server soft-fails: a member banned on one branch of a fork speaks on
  the other, deeper than the ban (``intended_soft_failures``);
- optionally, malformed lines (bad JSON, missing fields, content hash mismatches).

Invariants:

- the output depends only on the :class:`CorpusSpec` (seed included), never on the number
  of worker processes: each room has its own random generator seeded from ``(seed, room
  index)``, and the final shuffle uses the seed;
- exactly ``spec.events`` well-formed PDU lines plus ``spec.malformed`` malformed ones;
- lines are shuffled: a consumer must accept them in any order;
- every event the generator does not intend to be rejected is built from the generator's
  model of the room state at its prev events, which matches what the auth rules and state
  resolution compute (forks only hold changes whose resolution is predictable: messages,
  topic/name changes and joins of new users), so the intended rejections are the
  rejections.

Signing is the cost (about 100-200 µs per event), so rooms are generated in parallel
worker processes (``workers``), each returning its rooms' lines to the parent.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson
from signedjson.key import decode_signing_key_base64, encode_verify_key_base64, get_verify_key
from signedjson.types import SigningKey

from roomstream.events.auth import auth_types_for_event
from roomstream.events.format import (
    build_event_dict,
    finalise_local_event,
    room_id_for_create_event,
)
from roomstream.events.hashing import encode_base64
from roomstream.events.model import Event, StateKey
from roomstream.events.room_versions import RoomVersion, room_version
from roomstream.events.types import EventTypes

__all__ = [
    "CorpusSpec",
    "CorpusStats",
    "generate_cli",
    "generate_corpus",
    "server_keys",
]

_WORDS = (  # noqa: SIM905
    "hello world matrix room event state fork merge join leave topic name power level "
    "kick ban invite redact message federation server spark import stream ordering "
    "graph branch history alice bob carol dave erin frank grace heidi ivan judy"
).split()


@dataclass(frozen=True)
class CorpusSpec:
    """What to generate. ``events`` counts well-formed PDU lines (exactly)."""

    events: int = 10_000
    seed: int = 0
    servers: int = 6
    users_per_server: int = 400
    #: Smallest room (in events); sizes are Pareto distributed above it.
    min_room_events: int = 20
    #: Pareto shape: smaller means a heavier tail.
    tail_alpha: float = 1.2
    #: Largest room; default: a tenth of the corpus (at least ``20 * min_room_events``).
    max_room_events: int | None = None
    #: (room version, weight) pairs.
    versions: tuple[tuple[str, float], ...] = (("10", 0.25), ("11", 0.25), ("12", 0.5))
    #: Per step of a room's history: chance of a fork, and of an intended rejection.
    fork_rate: float = 0.03
    reject_rate: float = 0.02
    #: Share of forks where one branch bans a member and the other carries a message of
    #: that member, deeper than the ban: the receiving server soft-fails the message.
    soft_fail_rate: float = 0.25
    #: Share of rooms whose join rule is ``invite`` (joins need an invite first).
    invite_only_rate: float = 0.3
    #: Extra malformed lines mixed into the file.
    malformed: int = 0
    start_ts: int = 1_650_000_000_000

    def room_cap(self) -> int:
        if self.max_room_events is not None:
            return max(self.min_room_events, self.max_room_events)
        return max(20 * self.min_room_events, self.events // 10)


@dataclass
class RoomSummary:
    """What one generated room holds (for tests and the ``.meta.json`` side file)."""

    index: int
    room_id: str
    version: str
    events: int
    forks: int = 0
    #: Event IDs the auth rules must reject.
    rejected: list[str] = field(default_factory=list)
    #: Event IDs a server receiving the room in order must soft-fail.
    soft_failed: list[str] = field(default_factory=list)


@dataclass
class CorpusStats:
    """A summary of a generated file; written next to it as ``<path>.meta.json``."""

    path: str
    spec: dict[str, Any]
    lines: int
    events: int
    rooms: int
    room_sizes: list[int]
    versions: dict[str, int]
    forks: int
    intended_rejections: list[str]
    malformed_lines: list[int]
    intended_soft_failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# -- keys and users --------------------------------------------------------------------


def server_names(spec: CorpusSpec) -> list[str]:
    return [f"s{i}.corpus.test" for i in range(spec.servers)]


def server_keys(spec: CorpusSpec) -> dict[str, SigningKey]:
    """Each fake server's signing key, derived from the seed (so runs are reproducible)."""
    keys: dict[str, SigningKey] = {}
    for name in server_names(spec):
        seed = hashlib.sha256(f"roomstream-corpus:{spec.seed}:{name}".encode()).digest()
        keys[name] = decode_signing_key_base64("ed25519", "gen", encode_base64(seed))
    return keys


def _user(spec: CorpusSpec, n: int) -> str:
    server = n % spec.servers
    return f"@u{n // spec.servers}:s{server}.corpus.test"


# -- one room --------------------------------------------------------------------------


class _Model:
    """The generator's view of a room's state at one point of its DAG.

    Members are kept in one list per membership (swap-remove on change), so picking a
    random member is O(1) even in rooms with thousands of members; the lists' order
    depends only on the history, so generation stays deterministic.
    """

    def __init__(self, state: dict[StateKey, Event], tip: list[str], depth: int) -> None:
        self.state = state
        self.tip = tip
        self.depth = depth
        #: user -> membership, for every user with a membership event.
        self.members: dict[str, str] = {}
        self._groups: dict[str, list[str]] = {}
        self._position: dict[str, int] = {}

    def copy(self) -> _Model:
        other = _Model(dict(self.state), list(self.tip), self.depth)
        other.members = dict(self.members)
        other._groups = {k: list(v) for k, v in self._groups.items()}
        other._position = dict(self._position)
        return other

    def set_membership(self, user: str, membership: str) -> None:
        old = self.members.get(user)
        if old == membership:
            return
        if old is not None:
            group = self._groups[old]
            index = self._position[user]
            last = group.pop()
            if last != user:
                group[index] = last
                self._position[last] = index
        group = self._groups.setdefault(membership, [])
        self._position[user] = len(group)
        group.append(user)
        self.members[user] = membership

    def joined(self) -> list[str]:
        """The joined users (a live list: do not modify)."""
        return self._groups.get("join", [])

    def with_membership(self, membership: str) -> list[str]:
        return self._groups.get(membership, [])


class _RoomBuilder:
    def __init__(
        self,
        spec: CorpusSpec,
        keys: dict[str, SigningKey],
        index: int,
        size: int,
        version: RoomVersion,
    ) -> None:
        self.spec = spec
        self.keys = keys
        self.rng = random.Random(f"{spec.seed}:room:{index}")
        self.size = size
        self.version = version
        self.ts = spec.start_ts + index * 7_919 + self.rng.randrange(86_400_000)
        self.lines: list[bytes] = []
        self.ids: list[str] = []
        self.room_id = ""
        self.model = _Model({}, [], 0)
        self.summary = RoomSummary(index, "", version.identifier, 0)
        self.messages: list[Event] = []
        #: Messages redacted so far: some are redacted again (the first redaction counts).
        self.redacted: list[Event] = []
        self.user_count = spec.servers * spec.users_per_server
        self.creator = _user(spec, self.rng.randrange(self.user_count))

    # -- building events -------------------------------------------------------------

    def full(self) -> bool:
        return len(self.lines) >= self.size

    def _next_ts(self) -> int:
        self.ts += self.rng.randint(1, 90_000)
        return self.ts

    def _event(
        self,
        model: _Model,
        event_type: str,
        sender: str,
        content: dict[str, Any],
        *,
        state_key: str | None = None,
        redacts: str | None = None,
        prevs: Sequence[str] | None = None,
        depth: int | None = None,
        auth_ids: list[str] | None = None,
    ) -> Event:
        if auth_ids is None:
            keys = auth_types_for_event(self.version, event_type, state_key, sender, content)
            auth_ids = [model.state[k].event_id for k in keys if k in model.state]
        server = sender.rpartition(":")[2]
        event = finalise_local_event(
            build_event_dict(
                self.version,
                event_type=event_type,
                sender=sender,
                content=content,
                prev_events=list(model.tip if prevs is None else prevs),
                auth_events=auth_ids,
                depth=model.depth + 1 if depth is None else depth,
                room_id=self.room_id or None,
                state_key=state_key,
                redacts=redacts,
                origin_server_ts=self._next_ts(),
            ),
            self.version,
            server,
            self.keys[server],
        )
        self.lines.append(event.raw)
        self.ids.append(event.event_id)
        return event

    def _accept(self, model: _Model, event: Event) -> None:
        """Move ``model`` past an accepted event."""
        model.tip = [event.event_id]
        model.depth = event.depth
        if event.is_state():
            model.state[event.state_tuple] = event
            if event.type == EventTypes.MEMBER and event.state_key is not None:
                model.set_membership(event.state_key, str(event.content["membership"]))

    def _send(
        self,
        model: _Model,
        event_type: str,
        sender: str,
        content: dict[str, Any],
        *,
        state_key: str | None = None,
        redacts: str | None = None,
    ) -> Event:
        event = self._event(
            model, event_type, sender, content, state_key=state_key, redacts=redacts
        )
        self._accept(model, event)
        return event

    # -- the room's levels -----------------------------------------------------------

    def _levels(self, model: _Model) -> dict[str, Any]:
        return dict(model.state[(EventTypes.POWER_LEVELS, "")].content)

    def _level(self, model: _Model, user: str) -> float:
        if self.version.privileged_creators and user == self.creator:
            return float("inf")
        levels = model.state[(EventTypes.POWER_LEVELS, "")].content
        users = levels.get("users", {})
        return float(users.get(user, levels.get("users_default", 0)))

    def _moderators(self, model: _Model) -> list[str]:
        # users_default is 0, so only the creator and listed users can reach 50.
        users = model.state[(EventTypes.POWER_LEVELS, "")].content.get("users", {})
        listed = sorted(u for u, level in users.items() if level >= 50)
        candidates = [self.creator, *(u for u in listed if u != self.creator)]
        return [u for u in candidates if model.members.get(u) == "join"]

    def _plain_members(self, model: _Model) -> list[str]:
        return [u for u in model.joined() if self._level(model, u) < 50]

    def _fresh_user(self, model: _Model) -> str:
        for _ in range(50):
            user = _user(self.spec, self.rng.randrange(self.user_count))
            if user not in model.members and user != self.creator:
                return user
        n = self.rng.randrange(10**9)
        return f"@fresh{n}:{server_names(self.spec)[n % self.spec.servers]}"

    def _body(self) -> dict[str, Any]:
        words = self.rng.choices(_WORDS, k=self.rng.choice((3, 6, 12, 30)))
        return {"msgtype": "m.text", "body": " ".join(words)}

    # -- the history -----------------------------------------------------------------

    def build(self) -> tuple[list[bytes], RoomSummary]:
        self._create()
        steps: list[tuple[float, Callable[[], None]]] = [
            (55, self._message),
            (9, self._join),
            (3, self._leave),
            (3, self._invite),
            (1.5, self._kick),
            (1, self._ban),
            (0.5, self._unban),
            (3, self._topic_or_name),
            (1.5, self._power_change),
            (3, self._redaction),
        ]
        weights = [w for w, _ in steps]
        actions = [a for _, a in steps]
        while not self.full():
            roll = self.rng.random()
            if roll < self.spec.reject_rate:
                self._rejected()
            elif roll < self.spec.reject_rate + self.spec.fork_rate:
                self._fork()
            else:
                self.rng.choices(actions, weights)[0]()
        del self.lines[self.size :]
        kept = set(self.ids[: self.size])
        self.summary.room_id = self.room_id
        self.summary.events = len(self.lines)
        self.summary.rejected = [r for r in self.summary.rejected if r in kept]
        self.summary.soft_failed = [e for e in self.summary.soft_failed if e in kept]
        return self.lines, self.summary

    def _create(self) -> None:
        v = self.version
        content: dict[str, Any] = {"room_version": v.identifier}
        if not v.implicit_room_creator:
            content["creator"] = self.creator
        if not v.room_id_from_create_event:
            server = self.creator.rpartition(":")[2]
            self.room_id = f"!r{self.rng.getrandbits(64):016x}:{server}"
        create = self._event(
            self.model, EventTypes.CREATE, self.creator, content, state_key="", prevs=[], depth=1
        )
        self.room_id = room_id_for_create_event(create)
        self._accept(self.model, create)
        m = self.model
        self._send(
            m, EventTypes.MEMBER, self.creator, {"membership": "join"}, state_key=self.creator
        )
        users = {} if v.privileged_creators else {self.creator: 100}
        self._send(
            m,
            EventTypes.POWER_LEVELS,
            self.creator,
            {
                "users": users,
                "users_default": 0,
                "events_default": 0,
                "state_default": 50,
                "ban": 50,
                "kick": 50,
                "redact": 50,
                "invite": 0,
                "events": {},
            },
            state_key="",
        )
        rule = "invite" if self.rng.random() < self.spec.invite_only_rate else "public"
        self._send(m, EventTypes.JOIN_RULES, self.creator, {"join_rule": rule}, state_key="")
        self._send(
            m,
            EventTypes.HISTORY_VISIBILITY,
            self.creator,
            {"history_visibility": "shared"},
            state_key="",
        )
        self._send(
            m, EventTypes.NAME, self.creator, {"name": f"room {self.summary.index}"}, state_key=""
        )

    def _public(self, model: _Model) -> bool:
        return model.state[(EventTypes.JOIN_RULES, "")].content.get("join_rule") == "public"

    def _message(self, model: _Model | None = None) -> None:
        model = model or self.model
        sender = self.rng.choice(model.joined())
        content = self._body()
        if len(self.messages) % 5 == 4:
            # A thread reply to the message before, so imports carry relations. Decided
            # without drawing from the generator: the corpus keeps its shape.
            parent = self.messages[-1].event_id
            content["m.relates_to"] = {"rel_type": "m.thread", "event_id": parent}
        event = self._send(model, EventTypes.MESSAGE, sender, content)
        self.messages.append(event)

    def _join(self, model: _Model | None = None) -> None:
        model = model or self.model
        invited = model.with_membership("invite")
        if invited and (not self._public(model) or self.rng.random() < 0.5):
            user = self.rng.choice(invited)
        elif self._public(model):
            candidates = model.with_membership("leave")
            if candidates and self.rng.random() < 0.3:
                user = self.rng.choice(candidates)
            else:
                user = self._fresh_user(model)
        else:
            self._invite(model)
            return
        self._send(model, EventTypes.MEMBER, user, {"membership": "join"}, state_key=user)

    def _invite(self, model: _Model | None = None) -> None:
        model = model or self.model
        sender = self.rng.choice(model.joined())
        target = self._fresh_user(model)
        self._send(model, EventTypes.MEMBER, sender, {"membership": "invite"}, state_key=target)

    def _leave(self) -> None:
        members = [u for u in self.model.joined() if u != self.creator]
        if not members:
            return self._join()
        user = self.rng.choice(members)
        self._send(self.model, EventTypes.MEMBER, user, {"membership": "leave"}, state_key=user)

    def _kick(self) -> None:
        mods = self._moderators(self.model)
        targets = [u for u in self.model.joined() if u != self.creator]
        targets = [t for t in targets if self._level(self.model, t) < 50]
        if not mods or not targets:
            return self._message()
        sender, target = self.rng.choice(mods), self.rng.choice(targets)
        self._send(self.model, EventTypes.MEMBER, sender, {"membership": "leave"}, state_key=target)

    def _ban(self) -> None:
        mods = self._moderators(self.model)
        targets = [
            u
            for u, m in self.model.members.items()
            if m != "ban" and u != self.creator and self._level(self.model, u) < 50
        ]
        if not mods or not targets:
            return self._message()
        sender, target = self.rng.choice(mods), self.rng.choice(sorted(targets))
        self._send(self.model, EventTypes.MEMBER, sender, {"membership": "ban"}, state_key=target)

    def _unban(self) -> None:
        banned = self.model.with_membership("ban")
        mods = self._moderators(self.model)
        if not banned or not mods:
            return self._ban()
        sender, target = self.rng.choice(mods), self.rng.choice(banned)
        self._send(self.model, EventTypes.MEMBER, sender, {"membership": "leave"}, state_key=target)

    def _topic_or_name(self, model: _Model | None = None) -> None:
        model = model or self.model
        mods = self._moderators(model)
        if not mods:
            return self._message(model)
        sender = self.rng.choice(mods)
        words = " ".join(self.rng.choices(_WORDS, k=4))
        if self.rng.random() < 0.6:
            self._send(model, EventTypes.TOPIC, sender, {"topic": words}, state_key="")
        else:
            self._send(model, EventTypes.NAME, sender, {"name": words}, state_key="")

    def _power_change(self) -> None:
        m = self.model
        levels = self._levels(m)
        users = dict(levels.get("users", {}))
        plain = [u for u in self._plain_members(m) if u != self.creator]
        promoted = [u for u in users if u != self.creator and users[u] == 50]
        roll = self.rng.random()
        if plain and (roll < 0.6 or not promoted):
            users[self.rng.choice(plain)] = 50
        elif promoted and roll < 0.85:
            del users[self.rng.choice(sorted(promoted))]
        else:
            events = dict(levels.get("events", {}))
            events[EventTypes.TOPIC] = self.rng.choice((0, 50))
            levels["events"] = events
        levels["users"] = users
        self._send(m, EventTypes.POWER_LEVELS, self.creator, levels, state_key="")

    def _redaction(self) -> None:
        if not self.messages:
            return self._message()
        if self.redacted and self.rng.random() < 0.4:
            target = self.rng.choice(self.redacted[-50:])
        else:
            target = self.rng.choice(self.messages[-200:])
            self.redacted.append(target)
        mods = self._moderators(self.model)
        joined = self.model.joined()
        if target.sender in joined and self.rng.random() < 0.5:
            sender = target.sender
        elif mods:
            sender = self.rng.choice(mods)
        else:
            return self._message()
        content: dict[str, Any] = {"reason": "spam"} if self.rng.random() < 0.5 else {}
        self._send(self.model, EventTypes.REDACTION, sender, content, redacts=target.event_id)

    # -- rejections: leaves the auth rules refuse ------------------------------------

    def _rejected(self) -> None:
        m = self.model
        kind = self.rng.choice(("outsider", "unprivileged", "kick", "banned", "bad_auth"))
        plain = [u for u in self._plain_members(m) if u != self.creator]
        banned = m.with_membership("ban")
        if kind == "unprivileged" and plain:
            sender = self.rng.choice(plain)
            topic_level = self._levels(m).get("events", {}).get(EventTypes.TOPIC, 50)
            if topic_level > 0 and self.rng.random() < 0.5:
                event = self._event(m, EventTypes.TOPIC, sender, {"topic": "hijack"}, state_key="")
            else:
                levels = self._levels(m)
                levels["users"] = {**levels.get("users", {}), sender: 100}
                event = self._event(m, EventTypes.POWER_LEVELS, sender, levels, state_key="")
        elif kind == "kick" and len(plain) >= 2:
            sender, target = self.rng.sample(plain, 2)
            event = self._event(
                m, EventTypes.MEMBER, sender, {"membership": "leave"}, state_key=target
            )
        elif kind == "banned" and banned:
            event = self._event(m, EventTypes.MESSAGE, self.rng.choice(banned), self._body())
        elif kind == "bad_auth" and self.messages:
            sender = self.rng.choice(m.joined())
            keys = auth_types_for_event(self.version, EventTypes.MESSAGE, None, sender, {})
            auth_ids = [m.state[k].event_id for k in keys if k in m.state]
            auth_ids.append(self.rng.choice(self.messages[-50:]).event_id)
            event = self._event(m, EventTypes.MESSAGE, sender, self._body(), auth_ids=auth_ids)
        else:
            outsider = self._fresh_user(m)
            event = self._event(m, EventTypes.MESSAGE, outsider, self._body())
        self.summary.rejected.append(event.event_id)

    # -- forks -----------------------------------------------------------------------

    def _fork(self) -> None:
        base = self.model
        if len(self.lines) + 4 > self.size:
            return self._message()
        self.summary.forks += 1
        if self.rng.random() < self.spec.soft_fail_rate and self._soft_fail_fork(base):
            return
        branches: list[_Model] = []
        for _ in range(self.rng.choice((2, 2, 2, 3))):
            branch = base.copy()
            for _ in range(self.rng.randint(1, 4)):
                roll = self.rng.random()
                if roll < 0.15:
                    self._topic_or_name(branch)
                elif roll < 0.3 and self._public(branch):
                    user = self._fresh_user(branch)
                    self._send(
                        branch, EventTypes.MEMBER, user, {"membership": "join"}, state_key=user
                    )
                else:
                    self._message(branch)
            branches.append(branch)
        self._merge(base, branches)

    def _soft_fail_fork(self, base: _Model) -> bool:
        """Two branches: a moderator bans a member on one; on the other, after one to
        three messages of others, the member speaks. Persisted in order (the ban is
        shallower), the member's message passes the auth rules at its own state but not
        the room's current state: it is soft-failed. False if the room has no candidates.
        """
        mods = self._moderators(base)
        plain = [u for u in self._plain_members(base) if u != self.creator]
        if not mods or not plain or len(self.lines) + 7 > self.size:
            return False
        user = self.rng.choice(plain)
        mod = self.rng.choice(mods)
        banning = base.copy()
        self._send(banning, EventTypes.MEMBER, mod, {"membership": "ban"}, state_key=user)
        speaking = base.copy()
        others = [u for u in base.joined() if u != user]
        for _ in range(self.rng.randint(1, 3)):
            event = self._send(speaking, EventTypes.MESSAGE, self.rng.choice(others), self._body())
            self.messages.append(event)
        late = self._send(speaking, EventTypes.MESSAGE, user, self._body())
        self.summary.soft_failed.append(late.event_id)
        self._merge(base, [banning, speaking])
        return True

    def _merge(self, base: _Model, branches: list[_Model]) -> None:
        """Merge ``branches`` with one message listing every branch tip."""
        # Resolution of these branches: each key takes its latest (origin_server_ts) event
        # (a ban, the only power event a fork holds, is the latest change of its key too).
        merged = base.copy()
        keys = {k for b in branches for k in b.state}
        for key in sorted(keys):
            candidates = {b.state[key].event_id: b.state[key] for b in branches if key in b.state}
            winner = max(candidates.values(), key=lambda e: (e.origin_server_ts, e.event_id))
            merged.state[key] = winner
            if key[0] == EventTypes.MEMBER:
                merged.set_membership(key[1], str(winner.content["membership"]))
        merged.tip = sorted({t for b in branches for t in b.tip})
        merged.depth = max(b.depth for b in branches)
        self.model = merged
        self._message(merged)


# -- the plan and the workers ----------------------------------------------------------


def _plan(spec: CorpusSpec) -> list[tuple[int, int, str]]:
    """(room index, size, version) for every room; sizes sum to ``spec.events``."""
    rng = random.Random(f"{spec.seed}:plan")
    cap = spec.room_cap()
    names = [v for v, _ in spec.versions]
    weights = [w for _, w in spec.versions]
    plan: list[tuple[int, int, str]] = []
    total = 0
    while total < spec.events:
        u = rng.random()
        size = int(spec.min_room_events * (1.0 - u) ** (-1.0 / spec.tail_alpha))
        size = min(max(size, spec.min_room_events), cap, spec.events - total)
        if size < 8:  # too small for a room's initial state: grow the previous room
            index, previous, version = plan[-1]
            plan[-1] = (index, previous + size, version)
        else:
            plan.append((len(plan), size, rng.choices(names, weights)[0]))
        total += size
    return plan


def _build_rooms(
    args: tuple[CorpusSpec, list[tuple[int, int, str]]],
) -> list[tuple[int, list[bytes], RoomSummary]]:
    spec, rooms = args
    keys = server_keys(spec)
    out = []
    for index, size, version in rooms:
        lines, summary = _RoomBuilder(spec, keys, index, size, room_version(version)).build()
        out.append((index, lines, summary))
    return out


def _malformed_lines(rng: random.Random, sample: Sequence[bytes], count: int) -> list[bytes]:
    """Lines an importer must report: bad JSON, missing fields, tampered content."""
    out: list[bytes] = []
    for i in range(count):
        kind = i % 4
        source = rng.choice(sample)
        if kind == 0:
            out.append(source[: len(source) // 2])  # truncated JSON
        elif kind == 1:
            data = orjson.loads(source)
            data.pop("sender", None)
            out.append(orjson.dumps(data))
        elif kind == 2:
            data = orjson.loads(source)
            data["content"] = {**data["content"], "tampered": True}
            out.append(orjson.dumps(data))  # content hash mismatch
        else:
            out.append(b"[1, 2, 3]")
    return out


def generate_corpus(
    path: str | os.PathLike[str],
    spec: CorpusSpec,
    *,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> CorpusStats:
    """Generate ``spec`` into ``path`` (JSON lines) and ``<path>.meta.json`` (the stats).

    ``progress(events_done, events_total)`` is called as rooms complete.
    """
    started = time.perf_counter()
    plan = _plan(spec)
    workers = workers or os.cpu_count() or 1
    # Big rooms first, dealt round-robin into many small chunks so workers stay busy.
    ordered = sorted(plan, key=lambda r: -r[1])
    n_chunks = max(1, min(len(ordered), workers * 16))
    chunks: list[list[tuple[int, int, str]]] = [[] for _ in range(n_chunks)]
    for i, room in enumerate(ordered):
        chunks[i % n_chunks].append(room)
    by_index: dict[int, tuple[list[bytes], RoomSummary]] = {}
    done = 0
    tasks = [(spec, chunk) for chunk in chunks if chunk]
    results: Iterable[list[tuple[int, list[bytes], RoomSummary]]]
    if workers == 1:
        results = map(_build_rooms, tasks)
        pool = None
    else:
        pool = multiprocessing.get_context("fork").Pool(workers)
        results = pool.imap_unordered(_build_rooms, tasks)
    try:
        for chunk_result in results:
            for index, lines, summary in chunk_result:
                by_index[index] = (lines, summary)
                done += len(lines)
            if progress is not None:
                progress(done, spec.events)
    finally:
        if pool is not None:
            pool.close()
            pool.join()

    rng = random.Random(f"{spec.seed}:shuffle")
    lines = [line for index in sorted(by_index) for line in by_index[index][0]]
    rng.shuffle(lines)
    malformed_positions: list[int] = []
    if spec.malformed:
        bad = _malformed_lines(rng, lines[:1000], spec.malformed)
        for line in bad:
            position = rng.randrange(len(lines) + 1)
            lines.insert(position, line)
        bad_set = set(bad)
        malformed_positions = [i + 1 for i, line in enumerate(lines) if line in bad_set]
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with tmp.open("wb") as f:
        f.write(b"\n".join(lines))
        f.write(b"\n")
    tmp.replace(out)

    summaries = [by_index[i][1] for i in sorted(by_index)]
    versions: dict[str, int] = {}
    for s in summaries:
        versions[s.version] = versions.get(s.version, 0) + s.events
    stats = CorpusStats(
        path=str(out),
        spec=asdict(spec),
        lines=len(lines),
        events=sum(s.events for s in summaries),
        rooms=len(summaries),
        room_sizes=[s.events for s in summaries],
        versions=versions,
        forks=sum(s.forks for s in summaries),
        intended_rejections=[r for s in summaries for r in s.rejected],
        malformed_lines=malformed_positions,
        intended_soft_failures=[e for s in summaries for e in s.soft_failed],
        seconds=time.perf_counter() - started,
    )
    meta = out.with_name(out.name + ".meta.json")
    meta.write_text(json.dumps(stats.to_json()) + "\n", encoding="utf-8")
    keys = {
        name: {f"ed25519:{key.version}": encode_verify_key_base64(get_verify_key(key))}
        for name, key in server_keys(spec).items()
    }
    out.with_name(out.name + ".keys.json").write_text(json.dumps(keys, indent=1) + "\n")
    return stats


def generate_cli(
    path: str,
    *,
    events: int = 100_000,
    seed: int = 0,
    malformed: int = 0,
    workers: int | None = None,
) -> int:
    """``roomstream generate PATH``: write a corpus, show progress, print a summary.

    Prints the rooms, events, forks, intended rejections, the largest rooms and the time
    taken; returns the process exit code (0).
    """
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    console = Console()
    spec = CorpusSpec(events=events, seed=seed, malformed=malformed)
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task("signing events", total=events)
        stats = generate_corpus(
            path, spec, workers=workers, progress=lambda done, _: bar.update(task, completed=done)
        )
    sizes = sorted(stats.room_sizes, reverse=True)
    console.print(
        f"wrote {stats.lines:,} lines to {stats.path}: {stats.events:,} events in "
        f"{stats.rooms:,} rooms (largest {', '.join(map(str, sizes[:5]))}), "
        f"{stats.forks:,} forks, {len(stats.intended_rejections):,} events the auth rules "
        f"reject, {len(stats.malformed_lines)} malformed lines; versions {stats.versions}; "
        f"{stats.seconds:.1f} s ({stats.events / max(stats.seconds, 1e-9):,.0f} events/s)"
    )
    console.print(
        f"the servers' verify keys are in {stats.path}.keys.json: import with"
        f" `roomstream import {stats.path} --keys {stats.path}.keys.json`",
        markup=False,
    )
    return 0
