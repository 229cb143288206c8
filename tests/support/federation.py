"""A fake remote homeserver for the inbound federation tests: its signed events, a stub
``authenticate`` (the origin from a test header, in place of X-Matrix), the federation
routes on aiohttp's test client, and a fake outbound client that answers from the
remote's own event store (for gap filling)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from signedjson.types import SigningKey

from roomstream.errors import FederationEventNotFoundError, UnauthorizedError
from roomstream.events.auth import auth_types_for_event
from roomstream.events.format import finalise_local_event
from roomstream.events.model import Event
from roomstream.events.room_versions import room_version
from roomstream.events.signing import key_id, load_or_create_signing_key
from roomstream.events.types import EventTypes
from roomstream.federation.room_routes import install_room_routes
from roomstream.federation.server import FederationServer
from roomstream.httpbase import exact_json_content_type, matrix_error_middleware
from roomstream.reading import read_side_participants
from roomstream.rooms.engine import RoomEngine
from roomstream.storage import Database
from roomstream.streams import StreamSet
from tests.support.rooms import (
    BOB,
    REMOTE,
    SERVER,
    public_room,
    remote_event,
    remote_join,
    verify_key_base64,
)

#: The header the stub authenticate reads the origin from.
ORIGIN_HEADER = "X-Test-Origin"


async def header_authenticate(request: web.Request, body: bytes | None) -> str:
    """Stub for fedtransport's X-Matrix check: the origin is whatever the test says."""
    origin = request.headers.get(ORIGIN_HEADER)
    if not origin:
        raise UnauthorizedError("no test origin header")
    return origin


@asynccontextmanager
async def federation_client(server: FederationServer) -> AsyncIterator[FederationTestClient]:
    """The room routes of ``server`` behind aiohttp's test client."""
    app = web.Application(middlewares=[matrix_error_middleware])
    app.on_response_prepare.append(exact_json_content_type)
    install_room_routes(app, server, header_authenticate)
    client = TestClient(TestServer(app))
    await client.start_server()
    try:
        yield FederationTestClient(client)
    finally:
        await client.close()


@dataclass
class FederationTestClient:
    client: TestClient[Any, Any]

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        origin: str = REMOTE,
        raw: bytes | None = None,
        params: Any = None,
    ) -> tuple[int, Any]:
        # (json, not orjson: fuzzed bodies carry integers orjson cannot encode)
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        headers = {ORIGIN_HEADER: origin} if origin else {}
        async with self.client.request(
            method, path, data=data, headers=headers, params=params
        ) as resp:
            content = await resp.read()
            assert resp.content_type == "application/json", (resp.status, content[:200])
            return resp.status, orjson.loads(content)


async def remote_member_event(
    engine: RoomEngine,
    key: SigningKey,
    room_id: str,
    sender: str,
    event_type: str,
    content: dict[str, Any],
    *,
    state_key: str | None = None,
    prev_events: Sequence[str] | None = None,
    depth: int | None = None,
    auth_state: Mapping[tuple[str, str], str] | None = None,
) -> Event:
    """An event the remote server builds on the local room's current state (or on
    ``prev_events`` / ``auth_state`` when given), signed with ``key``."""
    version, extremities, current = await engine.persister.get_room_state(room_id)
    state = current if auth_state is None else auth_state
    keys = auth_types_for_event(version, event_type, state_key, sender, content)
    if not version.room_id_from_create_event:
        keys.append((EventTypes.CREATE, ""))
    auth = sorted({state[k] for k in keys if k in state})
    prevs = sorted(extremities) if prev_events is None else list(prev_events)
    if depth is None:
        known = await engine.persister.get_events(prevs)
        depth = max((e.depth for e in known.values()), default=0) + 1
    return remote_event(
        key, version, room_id, sender, event_type, content, prevs, auth, depth, state_key
    )


@dataclass
class FakeFederationClient:
    """Answers ``get_missing_events``, ``state_ids`` and ``event`` from ``events`` (the
    remote server's DAG), recording every request."""

    events: dict[str, Event] = field(default_factory=dict)
    #: event ID -> the state IDs before it, as the remote would answer /state_ids.
    states: dict[str, list[str]] = field(default_factory=dict)
    #: Events ``get_missing_events`` returns (None: refuse with an error).
    missing: list[Event] | None = None
    requests: list[tuple[str, str, str]] = field(default_factory=list)
    #: The body of each request (None for a GET).
    contents: list[object] = field(default_factory=list)

    def add(self, *events: Event) -> None:
        for event in events:
            self.events[event.event_id] = event

    async def request(
        self,
        method: str,
        destination: str,
        path: str,
        *,
        query: Mapping[str, str | Sequence[str]] | None = None,
        content: object | None = None,
        timeout: float = 60.0,  # noqa: ASYNC109 (the interface's)
    ) -> Any:
        self.requests.append((method, destination, path))
        self.contents.append(content)
        if "/get_missing_events/" in path:
            if self.missing is None:
                raise FederationEventNotFoundError("no missing events here")
            return {"events": [dict(e.data) for e in self.missing]}
        if "/state_ids/" in path:
            assert query is not None
            event_id = str(query["event_id"])
            state = self.states[event_id]
            chain: set[str] = set()
            stack = list(state)
            while stack:
                known = self.events.get(stack.pop())
                for auth_id in [] if known is None else known.auth_event_ids:
                    if auth_id not in chain:
                        chain.add(auth_id)
                        stack.append(auth_id)
            return {"pdu_ids": state, "auth_chain_ids": sorted(chain)}
        if "/event/" in path:
            event_id = unquote(path.rsplit("/", 1)[1])
            if event_id not in self.events:
                raise FederationEventNotFoundError(event_id)
            return {"origin": REMOTE, "pdus": [dict(self.events[event_id].data)]}
        raise AssertionError(f"unexpected request {method} {path}")


# -- fixtures (imported by the tests/federation/test_inbound_*.py modules) ------------------


@pytest.fixture
def remote_key(tmp_path: Path) -> SigningKey:
    """The remote server's signing key."""
    return load_or_create_signing_key(tmp_path / "remote", REMOTE)


@pytest.fixture
async def engine(
    database: Database, tmp_path: Path, remote_key: SigningKey
) -> AsyncIterator[RoomEngine]:
    """A local room engine (``local.test``) that knows the remote server's key."""
    streams = await StreamSet.open(database, "main", {})
    key = load_or_create_signing_key(tmp_path / "keys", SERVER)
    room_engine = RoomEngine(
        database, streams, SERVER, "main", key, participants=read_side_participants()
    )
    await room_engine.keys.add(REMOTE, key_id(remote_key), verify_key_base64(remote_key))
    yield room_engine
    await streams.flush()


SEND = "/_matrix/federation/v1/send/"


async def joined_room(engine: RoomEngine, remote_key: SigningKey) -> str:
    """A public room of Alice's that Bob (remote.test) has joined."""
    room_id = await public_room(engine)
    join, _, _ = await remote_join(engine, remote_key, room_id)
    [result] = await engine.receive_pdus([join.raw])
    assert result.rejected_reason is None and not result.outlier
    return room_id


def txn(*pdus: Event, edus: list[Any] | None = None) -> dict[str, Any]:
    return {
        "origin": REMOTE,
        "origin_server_ts": 1,
        "pdus": [dict(p.data) for p in pdus],
        "edus": edus or [],
    }


V1 = "/_matrix/federation/v1"


V2 = "/_matrix/federation/v2"


def q(value: str) -> str:
    return quote(value, safe="")


async def handshake(
    fed: FederationTestClient,
    key: SigningKey,
    room_id: str,
    membership: str,
    *,
    send_version: str = "v2",
) -> tuple[Event, tuple[int, Any]]:
    """make_<membership> then send_<membership> of Bob's event, signed by the remote."""
    status, made = await fed.call(
        "GET", f"{V1}/make_{membership}/{q(room_id)}/{q(BOB)}", params=[("ver", "12")]
    )
    assert status == 200, made
    version = room_version(made["room_version"])
    event = finalise_local_event(made["event"], version, REMOTE, key)
    prefix = V1 if send_version == "v1" else V2
    sent = await fed.call(
        "PUT",
        f"{prefix}/send_{membership}/{q(room_id)}/{q(event.event_id)}",
        dict(event.data),
    )
    return event, sent
