"""The room side of the Server-Server API, inbound: what other servers send and ask about
rooms (no HTTP here; :mod:`roomstream.federation.room_routes` is the thin layer on top).

Transactions (``/send``): at most :data:`MAX_PDUS` PDUs and :data:`MAX_EDUS` EDUs, else
refused whole; answered once per (origin, transaction ID): a retry gets the stored answer
(:mod:`roomstream.federation.transactions`), and a retry arriving while the first is in
progress waits for its answer. Each PDU is dropped with an error in the answer's ``pdus``
map when its sender is not of the origin server, when the room's server ACL denies the
origin, when the room is unknown, or when it fails the receive path's format and
signature checks; otherwise it goes through :meth:`RoomEngine.receive_pdus` (hashes, auth
rules, soft failure, state) and its entry is ``{}`` (rejected and soft-failed events too,
as in Synapse: they were received). PDUs whose prev events are unknown first get their
gap filled from the origin (:mod:`roomstream.federation.gaps`). Rooms are processed
concurrently, the events of one room in the order sent; EDUs go to the injected
:class:`EduHandler` concurrently with the PDUs, and an EDU that fails never fails the
transaction.

Queries answer only what the asking server may see
(:mod:`roomstream.federation.server_visibility`); the origin must be in the room (or the
room world-readable), else 403.

In a deployment of several processes (:mod:`roomstream.federation.cluster`), what changes
a room is carried out by the room's events writer: each room's PDUs of a transaction, the
membership handshakes and invites are handed to it (:meth:`FederationServer.on_forwarded`
there) when this process is not that writer; the answers are the writer's.

Membership handshakes (``make_*`` then ``send_*``): the user in the path must be of the
origin server; a template is built on the room's forward extremities and checked against
its current state; the signed event sent back is received like any PDU and must then be
accepted (not rejected, not soft-failed), else 403.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeGuard

from roomstream.errors import (
    AuthError,
    BadEventError,
    BadJsonError,
    FederationEventNotFoundError,
    FederationForbiddenError,
    FederationTransactionTooLargeError,
    IncompatibleRoomVersionError,
    InvalidParamError,
    UnableToAuthoriseJoinError,
    UnknownRoomError,
)
from roomstream.events.auth import (
    AUTHORISING_USER,
    KNOCK_RESTRICTED,
    RESTRICTED,
    auth_types_for_event,
    check_auth_rules,
    get_named_level,
    get_user_power_level,
)
from roomstream.events.format import ContentHashMismatchError, build_event_dict
from roomstream.events.model import Event, StateKey
from roomstream.events.room_versions import KNOWN_ROOM_VERSIONS, RoomVersion
from roomstream.events.signing import SigningKey, check_event_signatures, sign_event
from roomstream.events.types import EventTypes
from roomstream.federation.acl import server_allowed
from roomstream.federation.cluster import RoomOwners
from roomstream.federation.gaps import FederationRequester, GapFiller, pdu_bytes
from roomstream.federation.server_visibility import (
    filter_events_for_server,
    host_in_room_at,
    server_of,
)
from roomstream.federation.transactions import ReceivedTransactions
from roomstream.replication.endpoints import FederationRoomCall
from roomstream.rooms.engine import RoomEngine
from roomstream.state.resolution import effective_auth_event_ids

logger = logging.getLogger(__name__)

#: Most PDUs and EDUs in one transaction (the spec's limits; Synapse refuses more).
MAX_PDUS = 50
MAX_EDUS = 100
#: Most prev events of a membership template (Synapse's).
MAX_TEMPLATE_PREVS = 10
#: Most events a backfill or get_missing_events answer holds.
MAX_BACKFILL = 100
#: Most stripped state events kept with an invite from another server.
MAX_STRIPPED = 50
#: The stripped state given with a knock or invite (the spec's recommendation).
STRIPPED_STATE_TYPES = (
    EventTypes.CREATE,
    EventTypes.JOIN_RULES,
    "m.room.canonical_alias",
    "m.room.avatar",
    "m.room.name",
    "m.room.encryption",
    "m.room.topic",
)


class EduHandler(Protocol):
    """Inbound EDUs (implemented by fededus: ``federation/edus.py``)."""

    async def on_edu(self, origin: str, edu_type: str, content: Mapping[str, Any]) -> None: ...


class IgnoreEdus:
    """An :class:`EduHandler` that drops everything (until fededus's is wired in)."""

    async def on_edu(self, origin: str, edu_type: str, content: Mapping[str, Any]) -> None:
        return None


class FederationServer:
    """Inbound room federation for one process. ``owners``: which process carries out
    a room's writes (None: this one, for every room)."""

    def __init__(
        self,
        engine: RoomEngine,
        *,
        edus: EduHandler | None = None,
        client: FederationRequester | None = None,
        clock: Callable[[], float] = time.time,
        owners: RoomOwners | None = None,
    ) -> None:
        self.engine = engine
        self.owners = owners
        self.store = engine.store
        self.server_name = engine.server_name
        self.edus: EduHandler = edus or IgnoreEdus()
        self.gaps = None if client is None else GapFiller(engine, client)
        self.clock = clock
        self.transactions = ReceivedTransactions(engine.db)
        self._in_flight: dict[tuple[str, str], asyncio.Future[dict[str, Any]]] = {}
        # One room's inbound PDUs are handled one transaction at a time (Synapse's per-room
        # linearizer): a gap being filled is not filled twice, and order is kept. Only
        # rooms in use hold a lock (see EventPersister.room_lock).
        self._room_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def _remote_owner(self, room_id: str) -> str | None:
        return None if self.owners is None else self.owners.remote_owner(room_id)

    async def on_forwarded(self, call: FederationRoomCall) -> dict[str, Any]:
        """Carry out a request another process of this deployment received for a room
        this process writes (the internal API checked that it does); its answer."""
        args, origin, room_id = call.args, call.origin, call.room_id
        if call.op == "pdus":
            pdus = args.get("pdus")
            if not isinstance(pdus, list):
                raise BadJsonError("'pdus' must be an array")
            return {"pdus": await self._room_pdus(origin, room_id, pdus)}
        if call.op == "invite":
            body = args.get("body")
            if not isinstance(body, dict):
                raise BadJsonError("'body' must be an object")
            return await self.on_invite(origin, room_id, _str_arg(args, "event_id"), body)
        if call.op in ("make_join", "make_knock"):
            ver = args.get("ver", [])
            versions = ver if _str_list(ver) else []
            make = self.on_make_join if call.op == "make_join" else self.on_make_knock
            return await make(origin, room_id, _str_arg(args, "user_id"), versions)
        if call.op == "make_leave":
            return await self.on_make_leave(origin, room_id, _str_arg(args, "user_id"))
        send = {
            "send_join": self.on_send_join,
            "send_leave": self.on_send_leave,
            "send_knock": self.on_send_knock,
        }[call.op]
        return await send(origin, room_id, _str_arg(args, "event_id"), args.get("pdu"))

    # -- /send ------------------------------------------------------------------------

    async def on_send_transaction(
        self, origin: str, transaction_id: str, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Process a transaction once; the answer is ``{"pdus": {event_id: {} | {"error"}}}``."""
        pdus = body.get("pdus", [])
        edus = body.get("edus", [])
        if not isinstance(pdus, list) or not isinstance(edus, list):
            raise BadJsonError("'pdus' and 'edus' must be arrays")
        if len(pdus) > MAX_PDUS or len(edus) > MAX_EDUS:
            raise FederationTransactionTooLargeError(
                f"a transaction holds at most {MAX_PDUS} PDUs and {MAX_EDUS} EDUs"
            )
        key = (origin, transaction_id)
        running = self._in_flight.get(key)
        if running is not None:
            return await asyncio.shield(running)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._in_flight[key] = future
        try:
            answer = await self.transactions.get(origin, transaction_id, self._now_ms())
            if answer is None:
                answer = await self._process_transaction(origin, pdus, edus)
                await self.transactions.store(origin, transaction_id, answer, self._now_ms())
            future.set_result(answer)
            return answer
        except asyncio.CancelledError:
            future.cancel()  # a retry waiting on it processes the transaction again
            raise
        except Exception as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters get it, nobody else must
            raise
        finally:
            del self._in_flight[key]

    async def _process_transaction(
        self, origin: str, pdus: Sequence[object], edus: Sequence[object]
    ) -> dict[str, Any]:
        results: dict[str, dict[str, str]] = {}
        by_room: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for pdu in pdus:
            # A PDU without a room is dropped silently: nothing to key an answer on.
            if isinstance(pdu, dict) and isinstance(pdu.get("room_id"), str):
                by_room[pdu["room_id"]].append(pdu)
        answers = await asyncio.gather(
            *(self._room_pdus(origin, room_id, given) for room_id, given in by_room.items()),
            *(self._deliver_edu(origin, edu) for edu in edus),
        )
        for answer in answers[: len(by_room)]:
            if answer is not None:
                results.update(answer)
        return {"pdus": results}

    async def _room_pdus(
        self, origin: str, room_id: str, pdus: Sequence[object]
    ) -> dict[str, dict[str, str]]:
        """The results of one room's PDUs (all of ``room_id``), received in the order sent,
        here or by the room's writer. A writer that cannot be reached fails the whole
        transaction (503): the origin sends it again, and nothing was lost."""
        owner = self._remote_owner(room_id)
        if owner is not None:
            assert self.owners is not None
            answer = await self.owners.room_request(
                owner, room_id, origin, "pdus", {"pdus": list(pdus)}
            )
            given = answer.get("pdus")
            return dict(given) if isinstance(given, dict) else {}
        results: dict[str, dict[str, str]] = {}
        events: list[Event] = []
        for pdu in pdus:
            event = await self._parse_pdu(origin, pdu, results)
            if event is not None:
                if event.room_id != room_id:
                    continue  # (a forwarded PDU of another room: never sent so)
                events.append(event)
        if events:
            await self._receive_room(origin, room_id, events, results)
        return results

    async def _parse_pdu(
        self, origin: str, pdu: object, results: dict[str, dict[str, str]]
    ) -> Event | None:
        """The PDU parsed for its room's version, or None (with an error in ``results``
        when it has an ID to report it under; a PDU without one is dropped silently, as
        Synapse does)."""
        if not isinstance(pdu, dict):
            return None
        room_id = pdu.get("room_id")
        if not isinstance(room_id, str):
            return None
        version = await self.store.get_room_version(room_id)
        if version is None:
            return None  # a room we are not in: nothing to key an answer on either
        raw = pdu_bytes(pdu)
        try:
            event = await self.engine.parse_received(raw, version)
        except ContentHashMismatchError as exc:
            # The receive path uses its redacted form (the spec); keep the bytes received.
            event = Event(exc.redacted_event.data, version, exc.redacted_event.event_id, raw)
        except BadEventError as exc:
            event_id = pdu.get("event_id")  # only versions 1 and 2 carry it
            if isinstance(event_id, str):
                results[event_id] = {"error": exc.message}
            return None
        except Exception:  # not encodable at all (e.g. huge integers)
            return None
        if server_of(event.sender) != origin:
            results[event.event_id] = {
                "error": f"sender {event.sender} is not of the origin server {origin}"
            }
            return None
        return event

    async def _receive_room(
        self,
        origin: str,
        room_id: str,
        events: list[Event],
        results: dict[str, dict[str, str]],
    ) -> None:
        """The PDUs of one room, in the order sent."""
        lock = self._room_locks.get(room_id)
        if lock is None:
            lock = self._room_locks[room_id] = asyncio.Lock()
        async with lock:
            await self._receive_room_locked(origin, room_id, events, results)

    async def _receive_room_locked(
        self,
        origin: str,
        room_id: str,
        events: list[Event],
        results: dict[str, dict[str, str]],
    ) -> None:
        if await self.store.get_current_state_entry(room_id, (EventTypes.CREATE, "")) is None:
            # Known only through an out-of-band membership (an invite): not in the room.
            for event in events:
                results[event.event_id] = {"error": f"this server is not in {room_id}"}
            return
        if not await self._acl_allows(room_id, origin):
            for event in events:
                results[event.event_id] = {"error": f"server {origin} denied by the room's ACL"}
            return
        batch = {e.event_id for e in events}
        prevs = {p for e in events for p in e.prev_event_ids if p not in batch}
        known = await self.store.have_events(prevs)
        if known >= prevs:
            # Every prev event is known or in the batch: one batch through the receive path.
            try:
                await self.engine.receive_pdus([e.raw for e in events])
                for event in events:
                    results[event.event_id] = {}
                return
            except Exception:
                logger.info("batch of %s failed; one event at a time", room_id, exc_info=True)
        for event in events:
            results[event.event_id] = await self._receive_one(origin, event)

    async def _receive_one(self, origin: str, event: Event) -> dict[str, str]:
        try:
            have = await self.store.have_events(event.prev_event_ids)
            if self.gaps is not None and len(have) < len(set(event.prev_event_ids)):
                await self.gaps.receive_with_gap(origin, event)
            else:
                await self.engine.receive_pdus([event.raw])
        except BadEventError as exc:
            return {"error": exc.message}
        except Exception as exc:  # a failure of the gap's origin must not fail the others
            logger.warning("could not receive %s from %s", event.event_id, origin, exc_info=True)
            return {"error": f"could not process the event: {type(exc).__name__}"}
        return {}

    async def _deliver_edu(self, origin: str, edu: object) -> None:
        if not isinstance(edu, dict):
            return
        edu_type, content = edu.get("edu_type"), edu.get("content")
        if not isinstance(edu_type, str) or not isinstance(content, dict):
            return
        try:
            await self.edus.on_edu(origin, edu_type, content)
        except Exception:
            logger.warning("EDU %s from %s failed", edu_type, origin, exc_info=True)

    async def acl_allows(self, server_name: str, room_id: str) -> bool:
        """Whether the room's ``m.room.server_acl`` lets ``server_name`` in (EDUs too)."""
        return await self._acl_allows(room_id, server_name)

    async def _acl_allows(self, room_id: str, server_name: str) -> bool:
        acl_id = await self.store.get_current_state_entry(room_id, (EventTypes.SERVER_ACL, ""))
        if acl_id is None:
            return True
        acl = await self.store.get_event(acl_id)
        return acl is None or server_allowed(server_name, acl.content)

    # -- queries ----------------------------------------------------------------------

    async def _room_version(self, room_id: str) -> RoomVersion:
        version = await self.store.get_room_version(room_id)
        if version is None:
            raise UnknownRoomError(room_id)
        return version

    async def _event_in_room(self, room_id: str, event_id: str) -> Event:
        event = await self.store.get_event(event_id)
        if event is None or event.room_id != room_id:
            raise FederationEventNotFoundError(f"no event {event_id} in {room_id}")
        return event

    async def _check_access(self, origin: str, room_id: str, event_ids: Sequence[str]) -> None:
        if not await self._acl_allows(room_id, origin):
            raise FederationForbiddenError(f"server {origin} denied by the room's ACL")
        if not await host_in_room_at(self.store, room_id, origin, event_ids):
            raise FederationForbiddenError(f"host {origin} not in room {room_id}")

    async def auth_chain_ids(self, event_ids: Sequence[str]) -> list[str]:
        """Every event reachable from ``event_ids`` through auth events (not themselves)."""
        seen: set[str] = set()
        frontier = list(event_ids)
        while frontier:
            events = await self.store.get_events(frontier)
            frontier = []
            for event in events.values():
                # (v12: the create event is an auth event without being listed.)
                for auth_id in effective_auth_event_ids(event):
                    if auth_id not in seen:
                        seen.add(auth_id)
                        frontier.append(auth_id)
        return sorted(seen)

    async def _pdus(self, event_ids: Sequence[str]) -> list[dict[str, Any]]:
        events = await self.store.get_events(event_ids)
        return [dict(events[i].data) for i in event_ids if i in events]

    async def _state_ids_at(self, room_id: str, event_id: str) -> list[str]:
        await self._event_in_room(room_id, event_id)
        try:
            state = await self.store.get_state_at(event_id, before=True)
        except LookupError:
            raise FederationEventNotFoundError(f"no state known at {event_id}") from None
        return sorted(state.values())

    async def on_state_ids(self, origin: str, room_id: str, event_id: str) -> dict[str, Any]:
        """The state before ``event_id`` and its auth chain, as IDs."""
        await self._room_version(room_id)
        await self._check_access(origin, room_id, [event_id])
        state = await self._state_ids_at(room_id, event_id)
        return {"pdu_ids": state, "auth_chain_ids": await self.auth_chain_ids(state)}

    async def on_state(self, origin: str, room_id: str, event_id: str) -> dict[str, Any]:
        """The state before ``event_id`` and its auth chain, as PDUs."""
        await self._room_version(room_id)
        await self._check_access(origin, room_id, [event_id])
        state = await self._state_ids_at(room_id, event_id)
        chain = await self.auth_chain_ids(state)
        return {"pdus": await self._pdus(state), "auth_chain": await self._pdus(chain)}

    def _envelope(self, pdus: list[dict[str, Any]]) -> dict[str, Any]:
        return {"origin": self.server_name, "origin_server_ts": self._now_ms(), "pdus": pdus}

    async def on_event(self, origin: str, event_id: str) -> dict[str, Any]:
        """One event, as the asking server may see it."""
        event = await self.store.get_event(event_id)
        if event is None:
            raise FederationEventNotFoundError(f"no event {event_id}")
        await self._check_access(origin, event.room_id, [event_id])
        return self._envelope(await filter_events_for_server(self.store, origin, [event]))

    async def on_event_auth(self, origin: str, room_id: str, event_id: str) -> dict[str, Any]:
        """The auth chain of an event."""
        await self._room_version(room_id)
        await self._check_access(origin, room_id, [event_id])
        await self._event_in_room(room_id, event_id)
        return {"auth_chain": await self._pdus(await self.auth_chain_ids([event_id]))}

    async def on_backfill(
        self, origin: str, room_id: str, from_event_ids: Sequence[str], limit: int
    ) -> dict[str, Any]:
        """Events from ``from_event_ids`` backwards in topological order (newest first),
        at most ``limit`` (capped at :data:`MAX_BACKFILL`), as the asking server may see
        them."""
        await self._room_version(room_id)
        if not from_event_ids:
            raise InvalidParamError("'v' names no event")
        await self._check_access(origin, room_id, from_event_ids)
        limit = max(0, min(limit, MAX_BACKFILL))
        ids = await self.store.get_backfill_events(room_id, from_event_ids, limit)
        events = await self.store.get_events(ids)
        ordered = [events[i] for i in ids if i in events]
        return self._envelope(await filter_events_for_server(self.store, origin, ordered))

    async def on_get_missing_events(
        self, origin: str, room_id: str, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Events between ``earliest_events`` and ``latest_events`` (oldest first)."""
        await self._room_version(room_id)
        earliest, latest = body.get("earliest_events"), body.get("latest_events")
        if not _str_list(earliest) or not _str_list(latest):
            raise BadJsonError("'earliest_events' and 'latest_events' must be arrays of IDs")
        limit = body.get("limit", 10)
        min_depth = body.get("min_depth", 0)
        if not isinstance(limit, int) or not isinstance(min_depth, int):
            raise BadJsonError("'limit' and 'min_depth' must be integers")
        await self._check_access(origin, room_id, latest)
        ids = await self.store.get_missing_events(
            room_id, earliest, latest, max(0, min(limit, MAX_BACKFILL))
        )
        events = await self.store.get_events(ids)
        ordered = [events[i] for i in ids if i in events and events[i].depth >= min_depth]
        return {"events": await filter_events_for_server(self.store, origin, ordered)}

    # -- membership handshakes --------------------------------------------------------

    async def _template(
        self, origin: str, room_id: str, user_id: str, membership: str
    ) -> tuple[RoomVersion, dict[str, Any]]:
        """A membership event for ``user_id`` on the room's extremities, checked against
        the current state (the rules must allow it: 403 otherwise)."""
        if server_of(user_id) != origin:
            raise FederationForbiddenError(f"{user_id} is not a user of {origin}")
        version = await self._room_version(room_id)
        if not await self._acl_allows(room_id, origin):
            raise FederationForbiddenError(f"server {origin} denied by the room's ACL")
        _, extremities, current = await self.engine.persister.get_room_state(room_id)
        prevs = sorted(extremities)[:MAX_TEMPLATE_PREVS]
        content = {"membership": membership}
        if membership == "join":
            authoriser = await self._authorising_user(current, user_id)
            if authoriser is not None:
                content[AUTHORISING_USER] = authoriser
        keys = auth_types_for_event(version, EventTypes.MEMBER, user_id, user_id, content)
        auth_ids = [current[k] for k in keys if k in current]
        prev_events = await self.engine.persister.get_events(prevs)
        depth = max((e.depth for e in prev_events.values()), default=0) + 1
        template = build_event_dict(
            version,
            event_type=EventTypes.MEMBER,
            sender=user_id,
            content=content,
            prev_events=prevs,
            auth_events=auth_ids,
            depth=depth,
            room_id=room_id,
            state_key=user_id,
            origin_server_ts=self._now_ms(),
        )
        template["origin"] = origin  # versions 1-2 want it; later ones ignore it
        wanted: dict[StateKey, str] = {
            k: current[k] for k in [*keys, (EventTypes.CREATE, "")] if k in current
        }
        auth_events = await self.engine.persister.get_events(wanted.values())
        probe = Event(template, version, "$template")
        try:
            check_auth_rules(probe, {k: auth_events[v] for k, v in wanted.items()})
        except AuthError as exc:
            raise FederationForbiddenError(
                f"{user_id} may not {membership}: {exc.message}"
            ) from None
        return version, template

    async def _authorising_user(self, current: Mapping[StateKey, str], user_id: str) -> str | None:
        """For a join by a rule ``restricted`` or ``knock_restricted`` of a user neither
        joined nor invited: a local user who may invite (joined, power at least the
        invite level; the most powerful first, then by ID, as Synapse picks), after
        checking that the user is in one of the rooms the rule allows (as this server
        knows it). None when the join needs no authorising.

        403 when the user is in none of the allowed rooms; 400
        ``M_UNABLE_TO_AUTHORISE_JOIN`` when no local user could authorise it."""
        wanted = {
            k: current[k]
            for k in [
                (EventTypes.JOIN_RULES, ""),
                (EventTypes.POWER_LEVELS, ""),
                (EventTypes.CREATE, ""),
                (EventTypes.MEMBER, user_id),
            ]
            if k in current
        }
        events = await self.store.get_events(wanted.values())
        by_key = {k: events[v] for k, v in wanted.items() if v in events}
        rules = by_key.get((EventTypes.JOIN_RULES, ""))
        rule = rules.content.get("join_rule") if rules is not None else None
        if rule not in (RESTRICTED, KNOCK_RESTRICTED):
            return None
        own = by_key.get((EventTypes.MEMBER, user_id))
        if own is not None and own.membership in ("join", "invite"):
            return None
        allow = rules.content.get("allow") if rules is not None else None
        allowed_rooms = [
            entry["room_id"]
            for entry in (allow if isinstance(allow, list) else [])
            if isinstance(entry, dict)
            and entry.get("type") == "m.room_membership"
            and isinstance(entry.get("room_id"), str)
        ]
        for allowed in allowed_rooms:
            if await self.store.get_membership(allowed, user_id) == "join":
                break
        else:
            raise FederationForbiddenError(
                f"{user_id} is in none of the rooms whose members may join this room"
            )
        suffix = ":" + self.server_name
        members = [
            (key, event_id)
            for (etype, key), event_id in current.items()
            if etype == EventTypes.MEMBER and key.endswith(suffix)
        ]
        member_events = await self.store.get_events([e for _, e in members])
        invite_level = get_named_level(by_key, "invite")
        candidates = [
            (get_user_power_level(key, by_key), key)
            for key, event_id in members
            if event_id in member_events and member_events[event_id].membership == "join"
        ]
        able = sorted(((-level, key) for level, key in candidates if level >= invite_level))
        if not able:
            raise UnableToAuthoriseJoinError(f"no user of {self.server_name} may invite here")
        return able[0][1]

    async def on_make_join(
        self, origin: str, room_id: str, user_id: str, supported_versions: Sequence[str]
    ) -> dict[str, Any]:
        """A join template; 400 ``M_INCOMPATIBLE_ROOM_VERSION`` when the remote server
        does not support the room's version (``ver``; none given means only "1")."""
        owner = self._remote_owner(room_id)
        if owner is not None:
            return await self._forward(
                owner, room_id, origin, "make_join", user_id=user_id, ver=list(supported_versions)
            )
        version = await self._room_version(room_id)
        if version.identifier not in (supported_versions or ["1"]):
            raise IncompatibleRoomVersionError(
                f"your server does not support room version {version.identifier}",
                room_version=version.identifier,
            )
        _, template = await self._template(origin, room_id, user_id, "join")
        return {"event": template, "room_version": version.identifier}

    async def on_make_leave(self, origin: str, room_id: str, user_id: str) -> dict[str, Any]:
        owner = self._remote_owner(room_id)
        if owner is not None:
            return await self._forward(owner, room_id, origin, "make_leave", user_id=user_id)
        version, template = await self._template(origin, room_id, user_id, "leave")
        return {"event": template, "room_version": version.identifier}

    async def on_make_knock(
        self, origin: str, room_id: str, user_id: str, supported_versions: Sequence[str]
    ) -> dict[str, Any]:
        owner = self._remote_owner(room_id)
        if owner is not None:
            return await self._forward(
                owner, room_id, origin, "make_knock", user_id=user_id, ver=list(supported_versions)
            )
        version = await self._room_version(room_id)
        if version.identifier not in supported_versions:
            raise IncompatibleRoomVersionError(
                f"your server does not support room version {version.identifier}",
                room_version=version.identifier,
            )
        _, template = await self._template(origin, room_id, user_id, "knock")
        return {"event": template, "room_version": version.identifier}

    async def _receive_membership(
        self, origin: str, room_id: str, event_id: str, pdu: object, membership: str
    ) -> Event:
        """Check and receive a signed membership event sent back after a ``make_*``."""
        version = await self._room_version(room_id)
        if not isinstance(pdu, dict):
            raise BadJsonError("the event must be a JSON object")
        event = await self.engine.parse_received(pdu_bytes(pdu), version)
        if event.event_id != event_id:
            raise InvalidParamError(f"the event's ID is {event.event_id}, not {event_id}")
        if (
            event.room_id != room_id
            or event.type != EventTypes.MEMBER
            or event.membership != membership
            or event.state_key != event.sender
        ):
            raise InvalidParamError(f"not a {membership} of its sender in {room_id}")
        if server_of(event.sender) != origin:
            raise FederationForbiddenError(f"{event.sender} is not a user of {origin}")
        if not await self._acl_allows(room_id, origin):
            raise FederationForbiddenError(f"server {origin} denied by the room's ACL")
        authoriser = event.content.get(AUTHORISING_USER) if membership == "join" else None
        if isinstance(authoriser, str) and server_of(authoriser) == self.server_name:
            # A restricted join one of our users authorises: our signature vouches for it
            # (the auth rules then check that user may invite).
            signed = sign_event(
                dict(event.data), self.server_name, self._signing_key(), room_version=version
            )
            event = await self.engine.parse_received(pdu_bytes(signed), version)
        [result] = await self.engine.receive_pdus([event.raw])
        if result.rejected_reason is not None or result.soft_failed or result.outlier:
            reason = result.rejected_reason or "not allowed by the room's current state"
            raise FederationForbiddenError(f"{membership} refused: {reason}")
        return event

    async def on_send_join(
        self, origin: str, room_id: str, event_id: str, pdu: object
    ) -> dict[str, Any]:
        """Receive a join; answer the state before it, its auth chain and the servers in
        the room (v2: ``members_omitted`` false, every member given)."""
        owner = self._remote_owner(room_id)
        if owner is not None:
            return await self._forward(
                owner, room_id, origin, "send_join", event_id=event_id, pdu=pdu
            )
        event = await self._receive_membership(origin, room_id, event_id, pdu, "join")
        state_before = await self.store.get_state_at(event.event_id, before=True)
        state_after = await self.store.get_state_at(event.event_id)
        state_ids = sorted(state_before.values())
        chain = await self.auth_chain_ids([*state_ids, event.event_id])
        servers = sorted(
            {
                server_of(key)
                for (etype, key), member_id in state_after.items()
                if etype == EventTypes.MEMBER
                and (m := await self.store.get_event(member_id)) is not None
                and m.membership == "join"
            }
        )
        return {
            "origin": self.server_name,
            "event": dict(event.data),
            "state": await self._pdus(state_ids),
            "auth_chain": await self._pdus(chain),
            "members_omitted": False,
            "servers_in_room": servers,
        }

    async def on_send_leave(
        self, origin: str, room_id: str, event_id: str, pdu: object
    ) -> dict[str, Any]:
        owner = self._remote_owner(room_id)
        if owner is not None:
            return await self._forward(
                owner, room_id, origin, "send_leave", event_id=event_id, pdu=pdu
            )
        await self._receive_membership(origin, room_id, event_id, pdu, "leave")
        return {}

    async def on_send_knock(
        self, origin: str, room_id: str, event_id: str, pdu: object
    ) -> dict[str, Any]:
        """Receive a knock; answer the room's stripped state for the knocking user."""
        owner = self._remote_owner(room_id)
        if owner is not None:
            return await self._forward(
                owner, room_id, origin, "send_knock", event_id=event_id, pdu=pdu
            )
        await self._receive_membership(origin, room_id, event_id, pdu, "knock")
        return {"knock_room_state": await self.stripped_state(room_id)}

    async def stripped_state(self, room_id: str) -> list[dict[str, Any]]:
        """The room's current state of :data:`STRIPPED_STATE_TYPES`, stripped."""
        current = await self.store.get_current_state(room_id)
        ids = [current[(t, "")] for t in STRIPPED_STATE_TYPES if (t, "") in current]
        events = await self.store.get_events(ids)
        return [
            {
                "type": e.type,
                "state_key": e.state_key,
                "content": dict(e.content),
                "sender": e.sender,
            }
            for e in (events[i] for i in ids if i in events)
        ]

    async def on_invite(
        self, origin: str, room_id: str, event_id: str, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        """An invite of one of our users (v2): checked, counter-signed with our key, and
        stored as an out-of-band membership (an outlier that is the user's membership
        in a room not held here) with the ``invite_room_state`` the inviting server gave
        in its ``unsigned``, so the invited user sees it in /sync; the signed event is
        the answer. Carried out by the writer the room ID hashes to (the room may be
        unknown here), which then holds the membership."""
        owner = self._remote_owner(room_id)
        if owner is not None:
            return await self._forward(
                owner, room_id, origin, "invite", event_id=event_id, body=dict(body)
            )
        version_id = body.get("room_version")
        if not isinstance(version_id, str) or version_id not in KNOWN_ROOM_VERSIONS:
            raise IncompatibleRoomVersionError(
                f"room version {version_id!r} is not supported here",
                room_version=str(version_id),
            )
        version = KNOWN_ROOM_VERSIONS[version_id]
        pdu = body.get("event")
        if not isinstance(pdu, dict):
            raise BadJsonError("'event' must be a JSON object")
        event = await self.engine.parse_received(pdu_bytes(pdu), version)
        if event.event_id != event_id or event.room_id != room_id:
            raise InvalidParamError("the event's ID or room does not match the path")
        if event.type != EventTypes.MEMBER or event.membership != "invite":
            raise InvalidParamError("not an invite")
        invitee = event.state_key or ""
        if server_of(invitee) != self.server_name:
            raise InvalidParamError(f"{invitee} is not a user of this server")
        if server_of(event.sender) != origin:
            raise FederationForbiddenError(f"{event.sender} is not a user of {origin}")
        known = await self.engine.keys.verify_keys({origin})
        try:
            check_event_signatures(event, known)
        except BadEventError as exc:
            raise FederationForbiddenError(
                f"invite not signed by {origin}: {exc.message}"
            ) from None
        signed = sign_event(
            dict(event.data), self.server_name, self._signing_key(), room_version=version
        )
        # Stored with the stripped state the inviting server gave, in ``unsigned`` (which
        # hashes and signatures leave out), for the invited user's /sync.
        stripped = body.get("invite_room_state")
        if not isinstance(stripped, list):
            unsigned = signed.get("unsigned")
            given = unsigned.get("invite_room_state") if isinstance(unsigned, dict) else None
            stripped = given if isinstance(given, list) else []
        stored = dict(signed)
        stored["unsigned"] = {
            "invite_room_state": [e for e in stripped if _is_stripped_event(e)][:MAX_STRIPPED]
        }
        await self.engine.receive_out_of_band_membership(pdu_bytes(stored), version)
        return {"event": signed}

    def _signing_key(self) -> SigningKey:
        return self.engine.creator.signing_key

    async def _forward(
        self, owner: str, room_id: str, origin: str, op: str, **args: Any
    ) -> dict[str, Any]:
        assert self.owners is not None
        return await self.owners.room_request(owner, room_id, origin, op, args)


def _str_arg(args: Mapping[str, Any], name: str) -> str:
    value = args.get(name)
    if not isinstance(value, str):
        raise BadJsonError(f"'{name}' must be a string")
    return value


def _is_stripped_event(value: object) -> bool:
    """A stripped state event as the spec shapes it (type, state_key, sender, content)."""
    return (
        isinstance(value, dict)
        and isinstance(value.get("type"), str)
        and isinstance(value.get("state_key"), str)
        and isinstance(value.get("sender"), str)
        and isinstance(value.get("content"), dict)
    )


def _str_list(value: object) -> TypeGuard[list[str]]:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


__all__ = [
    "MAX_EDUS",
    "MAX_PDUS",
    "EduHandler",
    "FederationServer",
    "IgnoreEdus",
]
