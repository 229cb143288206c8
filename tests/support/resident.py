"""A resident server's side of the join handshake, in process, for testing the joining
side (:mod:`roomstream.federation.remote_rooms`) without a network.

:class:`ResidentServer` answers ``make_join`` and ``v2/send_join`` from a real
:class:`~roomstream.rooms.engine.RoomEngine` (the resident server's), the way the Server-
Server API says a resident server does: a template at the room's forward extremities with
the auth events the join needs; then the join received through the resident's own
receive path, and the state before it with the auth chain of that state and the join.
``tamper`` lets a test make it lie.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from roomstream.errors import ForbiddenError, NotFoundError
from roomstream.events.auth import auth_types_for_event
from roomstream.events.types import EventTypes
from roomstream.rooms.engine import RoomEngine


class ResidentServer:
    def __init__(self, engine: RoomEngine) -> None:
        self.engine = engine
        #: Called with send_join's answer before it is returned (a test's lie).
        self.tamper: Callable[[dict[str, Any]], None] | None = None
        self.requests: list[tuple[str, str]] = []

    async def request(
        self,
        method: str,
        destination: str,
        path: str,
        *,
        query: Mapping[str, str | Sequence[str]] | None = None,
        content: object | None = None,
    ) -> Any:
        assert destination == self.engine.server_name, destination
        self.requests.append((method, path))
        parts = [urllib.parse.unquote(p) for p in path.split("/")]
        if method == "GET" and parts[4] == "make_join":
            return await self._make_join(parts[5], parts[6])
        if method == "PUT" and parts[3:5] == ["v2", "send_join"]:
            assert isinstance(content, dict)
            return await self._send_join(parts[5], content)
        raise NotFoundError(f"the fake resident does not answer {method} {path}")

    async def _make_join(self, room_id: str, user_id: str) -> dict[str, Any]:
        engine = self.engine
        version = await engine.store.get_room_version(room_id)
        if version is None:
            raise NotFoundError(f"unknown room {room_id}")
        current = await engine.store.get_current_state(room_id)
        content = {"membership": "join"}
        wanted = auth_types_for_event(version, EventTypes.MEMBER, user_id, user_id, content)
        auth = sorted(current[k] for k in wanted if k in current)
        extremities = await engine.store.get_forward_extremities(room_id)
        events = await engine.store.get_events(extremities)
        depth = max(int(e.data["depth"]) for e in events.values()) + 1
        template = {
            "type": EventTypes.MEMBER,
            "room_id": room_id,
            "sender": user_id,
            "state_key": user_id,
            "content": content,
            "prev_events": extremities,
            "auth_events": auth,
            "depth": depth,
            "origin_server_ts": 0,
        }
        return {"event": template, "room_version": version.identifier}

    async def _send_join(self, room_id: str, pdu: dict[str, Any]) -> dict[str, Any]:
        engine = self.engine
        [result] = await engine.receive_pdus([orjson.dumps(pdu)])
        if result.rejected_reason is not None or result.outlier:
            raise ForbiddenError(f"join refused: {result.rejected_reason}")
        state = await engine.store.get_state_at(result.event_id, before=True)
        state_events = await engine.store.get_events(state.values())
        chain = await self._auth_chain([*state.values(), result.event_id])
        answer: dict[str, Any] = {
            "origin": engine.server_name,
            "members_omitted": False,
            "servers_in_room": sorted(await engine.store.joined_servers(room_id)),
            "state": [dict(e.data) for e in state_events.values()],
            "auth_chain": [dict(e.data) for e in chain],
        }
        if self.tamper is not None:
            self.tamper(answer)
        return answer

    async def _auth_chain(self, event_ids: Sequence[str]) -> list[Any]:
        """Every event reachable from ``event_ids`` through auth events."""
        chain: dict[str, Any] = {}
        todo = set(event_ids)
        while todo:
            found = await self.engine.store.get_events(todo)
            todo = set()
            for event in found.values():
                for auth_id in event.data.get("auth_events", []):
                    if auth_id not in chain:
                        todo.add(auth_id)
            for event_id in todo:
                chain[event_id] = None
            for event in found.values():
                if event.event_id in chain:
                    chain[event.event_id] = event
        return [e for e in chain.values() if e is not None]
