"""Filling gaps in a room's DAG from the server that sent an event (the spec's
"Retrieving missing events"; Synapse's ``_get_missing_events_for_pdu`` and
``_get_state_ids_after_missing_prev_event``).

When a received PDU names prev events this server does not hold:

1. ask its origin for what lies between our forward extremities (``earliest_events``) and
   the PDU (``latest_events``) with ``POST /get_missing_events`` (``limit`` 10,
   ``min_depth`` the smallest depth of our forward extremities, as Synapse); the events
   returned are received oldest first, each filling in what it can;
2. for an event (returned or the PDU) whose prev events are still unknown, ask for the
   state at each missing prev event: ``GET /state_ids?event_id=`` (the state before it),
   ``GET /event`` for the prev event itself and for every state or auth chain event not
   held here. Those are stored as *outliers* (no state of their own); the event is then
   stored with the state after its prev events (the prev event added to the state before
   it when it is a state event), resolved with the state after its known prev events.

The missing prev events themselves stay unknown except as outliers: they are the room's
*backwards extremities* (an event whose prev events are not stored), where backfill goes
on later. Everything fetched goes through the receive path's checks (signatures, hashes,
auth rules).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol
from urllib.parse import quote

import orjson

from roomstream.events.model import Event
from roomstream.rooms.engine import RoomEngine
from roomstream.rooms.persist import PersistedEvent
from roomstream.state.groups import StateMap

logger = logging.getLogger(__name__)

#: ``limit`` of a ``get_missing_events`` request (Synapse's).
MISSING_EVENTS_LIMIT = 10
#: Most events fetched one by one with ``/event`` for one gap's state.
MAX_FETCHED_FOR_STATE = 500


class FederationRequester(Protocol):
    """The part of fedtransport's ``FederationClient`` this module uses."""

    async def request(
        self,
        method: str,
        destination: str,
        path: str,
        *,
        query: Mapping[str, str | Sequence[str]] | None = None,
        content: object | None = None,
        timeout: float = 60.0,  # noqa: ASYNC109 (fed_shared.md's interface)
    ) -> Any: ...


def _segment(value: str) -> str:
    return quote(value, safe="")


def pdu_bytes(pdu: Mapping[str, Any]) -> bytes:
    """A PDU dict (decoded from a request or answer) as bytes for the receive path.
    Signatures and hashes cover the canonical form, so re-encoding keeps them valid; the
    receive path's strict parse then judges the PDU (floats, sizes, ...)."""
    return orjson.dumps(pdu)


class GapFiller:
    """Fetches what is missing below a received event, through ``client``."""

    def __init__(self, engine: RoomEngine, client: FederationRequester) -> None:
        self.engine = engine
        self.client = client

    async def missing_prevs(self, event: Event) -> list[str]:
        prevs = event.prev_event_ids
        have = await self.engine.store.have_events(prevs)
        return [p for p in prevs if p not in have]

    async def receive_with_gap(self, origin: str, event: Event) -> PersistedEvent:
        """Receive ``event`` (whose prev events are not all known), fetching what is
        missing from ``origin`` first."""
        missing = await self.missing_prevs(event)
        if missing:
            await self._get_missing_events(origin, event)
            missing = await self.missing_prevs(event)
        return await self._receive_at_gap(origin, event, missing)

    async def _receive_at_gap(
        self, origin: str, event: Event, missing: Sequence[str]
    ) -> PersistedEvent:
        states: list[StateMap] = []
        for prev in missing:
            states.append(await self.state_after(origin, event.room_id, prev))
        given = {event.event_id: states} if states else None
        results = await self.engine.receive_pdus([event.raw], state_before=given)
        return results[0]

    async def _get_missing_events(self, origin: str, event: Event) -> None:
        room_id = event.room_id
        extremities = await self.engine.store.get_forward_extremities(room_id)
        known = await self.engine.store.get_events(extremities)
        min_depth = min((e.depth for e in known.values()), default=0)
        answer = await self.client.request(
            "POST",
            origin,
            f"/_matrix/federation/v1/get_missing_events/{_segment(room_id)}",
            content={
                "earliest_events": sorted(extremities),
                "latest_events": [event.event_id],
                "limit": MISSING_EVENTS_LIMIT,
                "min_depth": min_depth,
            },
        )
        pdus = answer.get("events") if isinstance(answer, dict) else None
        if not isinstance(pdus, list):
            return
        parsed: list[Event] = []
        for pdu in pdus:
            if not isinstance(pdu, dict) or pdu.get("room_id") != room_id:
                continue
            try:
                parsed.append(await self.engine.parse_received(pdu_bytes(pdu)))
            except Exception:  # a bad event among them is skipped, as Synapse does
                logger.info("skipping a malformed missing event from %s", origin)
        parsed.sort(key=lambda e: e.depth)
        for pulled in parsed:
            if pulled.event_id == event.event_id or await self.engine.store.have_events(
                [pulled.event_id]
            ):
                continue
            still_missing = await self.missing_prevs(pulled)
            try:
                if still_missing:
                    await self._receive_at_gap(origin, pulled, still_missing)
                else:
                    await self.engine.receive_pdus([pulled.raw])
            except Exception:
                logger.info("could not store missing event %s", pulled.event_id, exc_info=True)

    async def state_after(self, origin: str, room_id: str, prev: str) -> StateMap:
        """The state after ``prev`` as ``origin`` tells it, its events stored as outliers
        (also used by :mod:`roomstream.federation.backfill` below a backfilled chunk)."""
        answer = await self.client.request(
            "GET",
            origin,
            f"/_matrix/federation/v1/state_ids/{_segment(room_id)}",
            query={"event_id": prev},
        )
        if not isinstance(answer, dict):
            raise ValueError("state_ids answer is not an object")
        state_ids = [i for i in answer.get("pdu_ids", []) if isinstance(i, str)]
        chain_ids = [i for i in answer.get("auth_chain_ids", []) if isinstance(i, str)]
        wanted = list(dict.fromkeys([prev, *state_ids, *chain_ids]))
        have = await self.engine.store.have_events(wanted)
        to_fetch = [i for i in wanted if i not in have][:MAX_FETCHED_FOR_STATE]
        raws: list[bytes] = []
        for event_id in to_fetch:
            raw = await self._fetch_event(origin, event_id)
            if raw is not None:
                raws.append(raw)
        if raws:
            await self.engine.receive_pdus(raws, outliers=True)
        events = await self.engine.store.get_events([prev, *state_ids])
        state: StateMap = {}
        for event_id in state_ids:
            found = events.get(event_id)
            if found is not None and found.is_state() and found.room_id == room_id:
                state[found.state_tuple] = event_id
        prev_event = events.get(prev)
        if prev_event is not None and prev_event.is_state():
            state[prev_event.state_tuple] = prev
        return state

    async def _fetch_event(self, origin: str, event_id: str) -> bytes | None:
        try:
            answer = await self.client.request(
                "GET", origin, f"/_matrix/federation/v1/event/{_segment(event_id)}"
            )
        except Exception:  # one event not served: the state goes on without it
            logger.info("could not fetch %s from %s", event_id, origin, exc_info=True)
            return None
        pdus = answer.get("pdus") if isinstance(answer, dict) else None
        if not isinstance(pdus, list) or len(pdus) != 1 or not isinstance(pdus[0], dict):
            return None
        return pdu_bytes(pdus[0])
