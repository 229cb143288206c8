"""Federation (issue 22 §6): roomstream and Synapse side by side in one run.

Usage::

    python bench/bench_federation.py [--quick] [--size N] [--no-synapse] [--postgres]

A load generator in this process acts as fake homeservers ``127.0.0.1:<port>``: each
serves its own signed ``GET /_matrix/key/v2/server`` and ``PUT /send`` over TLS (a
certificate from a throwaway CA that the targets trust or, for Synapse, do not check),
and talks to the targets with roomstream's own :class:`FederationClient` (every request
signed ``X-Matrix``). The targets are ``roomstream run`` on SQLite (``--postgres``: and on
PostgreSQL) and Synapse from PyPI on SQLite (``tests/support/synapse_peer.py``: IP-literal
server name, TLS federation listener, rate limiters out of the way; roomstream's per-origin
rate limit is raised likewise).

Scenarios:

- ``inbound_send``: a fake server joins one of its users to a public room of the target
  (``make_join`` / ``send_join`` v2), then sends M message PDUs, a chain (each one's
  ``prev_events`` the previous one), in transactions of 50 PDUs, one transaction at a
  time; PDUs/s from the first transaction until the last PDU is in the local member's
  timeline. Synapse answers ``/send`` once it has *staged* the PDUs and persists them
  afterwards, and past 100 staged events in a room it prunes the queue and asks the
  origin's ``/get_missing_events`` (not served here); so each transaction is sent once
  the previous one's last PDU shows in the target's ``/messages`` (polled every 10 ms),
  for every target alike. ``answers_seconds`` is the time spent waiting for ``/send``
  answers alone. Every answer must carry no per-PDU error, and afterwards the
  target's ``/messages`` must hold all M.
- ``fanout``: a public room of the target with one user of each of 10 fake servers
  joined; a local user sends K messages (``PUT /send`` of the Client-Server API, one
  after the other); the time from the first send to the moment every destination has
  received all K (distinct events, counted by the fake servers' ``/send``), and the part
  of it after the last send was answered (``delivered_after_last_send_seconds``).
- ``join_1000``: a room held by a roomstream resident with 1,000 joined members (its
  local creator and 999 users of one fake server: one joined by ``send_join``, the rest
  by member events over ``/send``, each transaction once the resident shows the previous
  one's members); the time a target's local user's ``POST /join`` takes (``server_name``
  = the resident), and the joined-member count the target then shows. The resident is
  roomstream (SQLite); the joiners are a second roomstream (SQLite), the PostgreSQL
  target (``--postgres``) and the Synapse target, one after the other (so each room has
  one more member than the last joiner saw). With Synapse, the same is repeated with a
  second Synapse as the resident (``join_1000_synapse_resident``), joined by the Synapse
  target and then by the SQLite roomstream joiner. Synapse asks ``send_join`` for
  ``omit_members`` (faster joins): a Synapse resident grants it (a partial-state join,
  whose state Synapse completes in the background after ``/join`` answered), roomstream
  answers the full state (a full join).

Default sizes are small (M = 1,000, K = 100, 1,000 members); ``--size N`` multiplies M
and K; ``--quick`` divides everything by 5. Results: ``bench/results/federation.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import ssl
import sys
import tempfile
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
import yaml  # noqa: E402
from aiohttp import web  # noqa: E402
from psycopg import sql  # noqa: E402
from signedjson.key import encode_verify_key_base64, generate_signing_key  # noqa: E402
from signedjson.sign import sign_json  # noqa: E402
from tests.support.federation_servers import FederatedServer  # noqa: E402
from tests.support.ports import free_port  # noqa: E402
from tests.support.synapse_peer import SynapsePeer, synapse_peer  # noqa: E402
from tests.support.wait import wait_for  # noqa: E402

import common  # noqa: E402
from roomstream.config import FederationConfig  # noqa: E402
from roomstream.events.format import build_event_dict, finalise_local_event  # noqa: E402
from roomstream.events.hashing import compute_event_id  # noqa: E402
from roomstream.events.model import Event  # noqa: E402
from roomstream.events.room_versions import RoomVersion, room_version  # noqa: E402
from roomstream.events.signing import SigningKey, key_id  # noqa: E402
from roomstream.federation.certs import TestCertificateAuthority  # noqa: E402
from roomstream.federation.client import FederationClient  # noqa: E402
from roomstream.storage import DatabaseConfig  # noqa: E402

#: PDUs per inbound transaction (the spec's limit, and what Synapse's sender sends).
TXN_PDUS = 50
FANOUT_DESTINATIONS = 10
ROOM_MEMBERS = 1000
#: Roomstream's per-origin limiter set out of the way, as synapse_peer does for Synapse.
RATE_LIMIT = {"rate_limit_per_second": 1_000_000.0, "rate_limit_burst": 1_000_000}

#: (method, path after /_matrix/client/v3, body, token) -> (status, JSON answer)
ClientCall = Callable[..., Awaitable[tuple[int, Any]]]


def q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def now_ms() -> int:
    return int(time.time() * 1000)


# -- the targets: a local user on each, through the Client-Server API ----------------------


@dataclass
class Target:
    """One homeserver under test: its federation name and one way to its client API."""

    label: str
    server_name: str
    call: ClientCall
    register: Callable[[str], Awaitable[tuple[str, str]]]

    async def ok(self, method: str, path: str, body: Any = None, *, token: str) -> Any:
        status, answer = await self.call(method, path, body, token=token)
        if status != 200:
            raise RuntimeError(f"{self.label}: {method} {path} answered {status}: {answer}")
        return answer


def roomstream_target(server: FederatedServer, label: str) -> Target:
    async def register(name: str) -> tuple[str, str]:
        account = await server.register(name)
        return account.user_id, account.token

    return Target(label, server.server_name, server.call, register)


def synapse_target(peer: SynapsePeer) -> Target:
    return Target("synapse_sqlite", peer.server_name, peer.call, peer.register)


async def count_messages(target: Target, token: str, room_id: str, sender: str | None) -> int:
    """``m.room.message`` events in ``room_id``'s timeline as the local member reads it
    (``/messages`` backwards to the start), of ``sender`` if given."""
    count = 0
    since = ""
    while True:
        path = f"/rooms/{q(room_id)}/messages?dir=b&limit=500{since}"
        answer = await target.ok("GET", path, token=token)
        chunk = answer.get("chunk", [])
        count += sum(
            1
            for e in chunk
            if e.get("type") == "m.room.message" and (sender is None or e.get("sender") == sender)
        )
        if not chunk or "end" not in answer:
            return count
        since = f"&from={q(answer['end'])}"


async def joined_count(target: Target, token: str, room_id: str) -> int:
    answer = await target.ok("GET", f"/rooms/{q(room_id)}/joined_members", token=token)
    return len(answer["joined"])


async def public_room(target: Target, token: str, name: str) -> str:
    body = {"preset": "public_chat", "name": name}
    return str((await target.ok("POST", "/createRoom", body, token=token))["room_id"])


# -- the load generator: fake homeservers ----------------------------------------------------


@dataclass
class JoinedRoom:
    """A room a fake server's user joined: what its next events build on.

    Invariant: ``last`` is the latest event this fake server sent (its chain's tip) and
    ``depth`` that event's depth; ``state`` maps (type, state_key) to the event IDs the
    auth events of new events are picked from."""

    room_id: str
    version: RoomVersion
    state: dict[tuple[str, str], str]
    last: str
    depth: int


@dataclass
class FakeServer:
    """A homeserver made of a TLS key endpoint, a ``/send`` endpoint that counts the
    messages it receives, and roomstream's federation client signing as it.

    Its ``/send`` checks neither the ``X-Matrix`` authorization nor the PDUs' signatures
    (what is measured is the target's work, not the generator's), accepts every PDU and
    answers ``{"pdus": {event_id: {}}}``; anything else it is asked is ``404``."""

    cert_dir: Path
    ca: TestCertificateAuthority
    port: int = field(default_factory=free_port)
    signing_key: SigningKey = field(default_factory=lambda: generate_signing_key("bench"))
    #: Bodies of the ``m.room.message`` events received over ``/send``, by room.
    received: dict[str, set[str]] = field(default_factory=dict)
    #: Awaited by the fan-out scenario: (room, count) -> set once that many arrived.
    watchers: list[tuple[str, int, asyncio.Event]] = field(default_factory=list)
    #: The version of each room joined (to name received PDUs by their event IDs).
    versions: dict[str, RoomVersion] = field(default_factory=dict)
    _runner: web.AppRunner | None = None
    _client: FederationClient | None = None
    _txn: itertools.count[int] = field(default_factory=itertools.count)

    @property
    def server_name(self) -> str:
        return f"127.0.0.1:{self.port}"

    def user(self, local: str) -> str:
        return f"@{local}:{self.server_name}"

    def own_keys(self) -> dict[str, Any]:
        verify_key = self.signing_key.verify_key
        body = {
            "server_name": self.server_name,
            "valid_until_ts": now_ms() + 24 * 3600 * 1000,
            "verify_keys": {
                key_id(self.signing_key): {"key": encode_verify_key_base64(verify_key)}
            },
            "old_verify_keys": {},
        }
        return dict(sign_json(body, self.server_name, self.signing_key))

    async def start(self) -> None:
        pair = self.ca.issue("127.0.0.1")
        cert, key = self.cert_dir / f"{self.port}.crt", self.cert_dir / f"{self.port}.key"
        cert.write_bytes(pair.certificate_pem)
        key.write_bytes(pair.private_key_pem)
        ca_path = self.cert_dir / "ca.pem"
        ca_path.write_bytes(self.ca.certificate_pem)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)

        async def keys(request: web.Request) -> web.Response:
            return web.json_response(self.own_keys())

        async def send(request: web.Request) -> web.Response:
            body = await request.json()
            pdus = body.get("pdus", [])
            answers: dict[str, Any] = {}
            for pdu in pdus:
                version = self.versions.get(str(pdu.get("room_id")))
                if version is not None:
                    answers[compute_event_id(pdu, version)] = {}
                if pdu.get("type") == "m.room.message":
                    bodies = self.received.setdefault(pdu.get("room_id", ""), set())
                    bodies.add(str(pdu.get("content", {}).get("body")))
            for room_id, count, event in self.watchers:
                if len(self.received.get(room_id, ())) >= count:
                    event.set()
            return web.json_response({"pdus": answers})

        async def unknown(request: web.Request) -> web.Response:
            body = {"errcode": "M_UNRECOGNIZED", "error": "not served by the load generator"}
            return web.json_response(body, status=404)

        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/_matrix/key/v2/server", keys)
        app.router.add_get("/_matrix/key/v2/server/{key_id}", keys)
        app.router.add_put("/_matrix/federation/v1/send/{txn_id}", send)
        app.router.add_route("*", "/{rest:.*}", unknown)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=context).start()
        config = FederationConfig(
            ca_certificates_path=str(ca_path), ip_range_blacklist=(), request_timeout=600.0
        )
        self._client = FederationClient(self.server_name, self.signing_key, config)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def client(self) -> FederationClient:
        assert self._client is not None, "start() first"
        return self._client

    def finalise(self, event_dict: dict[str, Any], version: RoomVersion) -> Event:
        return finalise_local_event(event_dict, version, self.server_name, self.signing_key)

    async def join(self, destination: str, room_id: str, local: str) -> JoinedRoom:
        """Join ``@local:<this server>`` to ``room_id`` through ``destination``."""
        user_id = self.user(local)
        answer = await self.client.request(
            "GET",
            destination,
            f"/_matrix/federation/v1/make_join/{q(room_id)}/{q(user_id)}",
            query={"ver": ["10", "11", "12"]},
        )
        version = room_version(answer.get("room_version", "1"))
        self.versions[room_id] = version
        template = dict(answer["event"])
        template["origin_server_ts"] = now_ms()
        template.pop("origin", None)
        template.pop("hashes", None)
        template.pop("signatures", None)
        join = self.finalise(template, version)
        sent = await self.client.request(
            "PUT",
            destination,
            f"/_matrix/federation/v2/send_join/{q(room_id)}/{q(join.event_id)}",
            content=join.data,
        )
        state = {
            (pdu["type"], pdu["state_key"]): compute_event_id(pdu, version) for pdu in sent["state"]
        }
        state[("m.room.member", user_id)] = join.event_id
        if version.room_id_from_create_event:
            state[("m.room.create", "")] = "$" + room_id[1:]
        return JoinedRoom(room_id, version, state, join.event_id, int(join.data["depth"]))

    def _auth_events(self, room: JoinedRoom, keys: list[tuple[str, str]]) -> list[str]:
        if not room.version.room_id_from_create_event:
            keys = [("m.room.create", ""), *keys]
        return [room.state[k] for k in keys if k in room.state]

    def next_event(
        self,
        room: JoinedRoom,
        sender: str,
        event_type: str,
        content: dict[str, Any],
        auth_keys: list[tuple[str, str]],
        state_key: str | None = None,
    ) -> Event:
        """The next event of this server's chain in ``room`` (``room`` advanced)."""
        room.depth += 1
        event = self.finalise(
            build_event_dict(
                room.version,
                event_type=event_type,
                sender=sender,
                content=content,
                prev_events=[room.last],
                auth_events=self._auth_events(room, auth_keys),
                depth=room.depth,
                room_id=room.room_id,
                state_key=state_key,
            ),
            room.version,
        )
        room.last = event.event_id
        return event

    def message(self, room: JoinedRoom, sender: str, body: str) -> Event:
        keys = [("m.room.power_levels", ""), ("m.room.member", sender)]
        return self.next_event(
            room, sender, "m.room.message", {"msgtype": "m.text", "body": body}, keys
        )

    def member_join(self, room: JoinedRoom, user_id: str) -> Event:
        keys = [("m.room.power_levels", ""), ("m.room.join_rules", "")]
        event = self.next_event(
            room, user_id, "m.room.member", {"membership": "join"}, keys, state_key=user_id
        )
        room.state[("m.room.member", user_id)] = event.event_id
        return event

    async def send_transaction(self, destination: str, events: list[Event]) -> None:
        """One ``PUT /send`` of ``events``; any per-PDU error is an exception."""
        body = {
            "origin": self.server_name,
            "origin_server_ts": now_ms(),
            "pdus": [e.data for e in events],
        }
        txn_id = f"bench{time.time_ns()}-{next(self._txn)}"
        answer = await self.client.send_transaction(destination, txn_id, body)
        failed = {eid: r for eid, r in answer.get("pdus", {}).items() if r}
        if failed:
            raise RuntimeError(f"{destination} refused PDUs: {list(failed.items())[:3]}")

    async def send_all(self, destination: str, events: list[Event]) -> None:
        for start in range(0, len(events), TXN_PDUS):
            await self.send_transaction(destination, events[start : start + TXN_PDUS])


# -- scenarios -------------------------------------------------------------------------------


async def inbound_send(target: Target, fake: FakeServer, messages: int) -> dict[str, Any]:
    _local, token = await target.register(f"inbound{fake.port}")
    room_id = await public_room(target, token, "inbound")
    room = await fake.join(target.server_name, room_id, "loader")
    sender = fake.user("loader")
    # Built (hashed, signed) before the clock starts: only the target's work is timed.
    events = [fake.message(room, sender, f"inbound {i}") for i in range(messages)]
    answering = 0.0
    with common.timed() as timer:
        for start in range(0, messages, TXN_PDUS):
            batch = events[start : start + TXN_PDUS]
            before = time.perf_counter()
            await fake.send_transaction(target.server_name, batch)
            answering += time.perf_counter() - before
            # Synapse answers /send once the PDUs are staged, persists them afterwards,
            # and prunes a room's staging queue past 100 events (then asks the origin's
            # /get_missing_events, which the generator does not serve). So the next
            # transaction goes once this one's last PDU is in the local member's
            # timeline (the chain is accepted in order: the last there means all are).
            last_body = str(batch[-1].data["content"]["body"])
            await wait_for(
                lambda body=last_body: _latest_body_is(target, token, room_id, body),
                600,
                f"{target.label} to store {last_body!r}",
                interval=0.01,
            )
    stored = await count_messages(target, token, room_id, sender)
    if stored != messages:
        raise RuntimeError(f"{target.label} stored {stored} of {messages} inbound messages")
    return {
        "messages": messages,
        "transactions": -(-messages // TXN_PDUS),
        "answers_seconds": round(answering, 3),
        # By the answers alone: Synapse's answer means staged, not stored (docstring).
        "answers_pdus_per_second": round(common.rate(messages, answering), 1),
        "seconds": round(timer.seconds, 3),
        "pdus_per_second": round(common.rate(messages, timer.seconds), 1),
        "stored": stored,
    }


async def _latest_body_is(target: Target, token: str, room_id: str, body: str) -> bool:
    path = f"/rooms/{q(room_id)}/messages?dir=b&limit=1"
    chunk = (await target.ok("GET", path, token=token)).get("chunk", [])
    return bool(chunk) and chunk[0].get("content", {}).get("body") == body


async def fanout(target: Target, fakes: list[FakeServer], messages: int) -> dict[str, Any]:
    _local, token = await target.register(f"fanout{fakes[0].port}")
    room_id = await public_room(target, token, "fanout")
    for fake in fakes:
        await fake.join(target.server_name, room_id, "listener")
    done = []
    for fake in fakes:
        event = asyncio.Event()
        fake.watchers.append((room_id, messages, event))
        done.append(event)
    with common.timed() as timer:
        for i in range(messages):
            path = f"/rooms/{q(room_id)}/send/m.room.message/fan{i}"
            await target.ok("PUT", path, {"msgtype": "m.text", "body": f"fan {i}"}, token=token)
        sent = time.perf_counter() - timer.start
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in done)), 300)
    return {
        "destinations": len(fakes),
        "messages": messages,
        "client_sends_seconds": round(sent, 3),
        "seconds": round(timer.seconds, 3),
        # What is left after the last send answered: the sender's own delay.
        "delivered_after_last_send_seconds": round(timer.seconds - sent, 3),
        "messages_per_second": round(common.rate(messages, timer.seconds), 1),
        "pdus_delivered_per_second": round(common.rate(messages * len(fakes), timer.seconds), 1),
    }


async def big_room(resident: Target, fake: FakeServer, members: int) -> tuple[str, str]:
    """A public room on ``resident`` with ``members`` joined: its local creator and
    ``members - 1`` users of ``fake``; (room ID, creator's token). Each transaction of
    joins goes once the resident shows the previous one's members (Synapse stages and
    prunes inbound PDUs, see the module docstring)."""
    _local, token = await resident.register(f"resident{fake.port}")
    room_id = await public_room(resident, token, "a thousand members")
    room = await fake.join(resident.server_name, room_id, "member0")
    joins = [fake.member_join(room, fake.user(f"member{i}")) for i in range(1, members - 1)]
    for start in range(0, len(joins), TXN_PDUS):
        batch = joins[start : start + TXN_PDUS]
        await fake.send_transaction(resident.server_name, batch)
        want = 2 + start + len(batch)
        await wait_for(
            lambda want=want: _joined_at_least(resident, token, room_id, want),
            600,
            f"{want} members on {resident.label}",
            interval=0.05,
        )
    return room_id, token


async def _joined_at_least(target: Target, token: str, room_id: str, want: int) -> bool:
    return await joined_count(target, token, room_id) >= want


async def join_remote(target: Target, resident: str, room_id: str) -> dict[str, Any]:
    _local, token = await target.register(f"joiner{free_port()}")
    path = f"/join/{q(room_id)}?server_name={q(resident)}"
    with common.timed() as timer:
        await target.ok("POST", path, {}, token=token)
    members = await joined_count(target, token, room_id)
    return {"seconds": round(timer.seconds, 3), "joined_members_seen": members}


# -- servers ---------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def roomstream_server(
    work: Path, label: str, ca: TestCertificateAuthority, db_config: DatabaseConfig
) -> AsyncIterator[FederatedServer]:
    server = FederatedServer(work, label, db_config, ca)
    path = server.write_config()
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    config["federation"].update(RATE_LIMIT)
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    await server.start()
    try:
        yield server
    finally:
        await server.close()


@contextlib.contextmanager
def pg_database() -> Iterator[str]:
    """The DSN of a new, empty PostgreSQL database, dropped (forcibly) afterwards."""
    name = f"roomstream_fedbench_{os.getpid()}"
    with psycopg.connect(common.PG_ADMIN_DSN, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield common.PG_ADMIN_DSN.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(common.PG_ADMIN_DSN, autocommit=True) as admin:
            drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
            admin.execute(drop.format(sql.Identifier(name)))


def _sqlite(work: Path, label: str) -> DatabaseConfig:
    return DatabaseConfig(engine="sqlite", path=str(work / label / "server.db"))


async def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    divisor = 5 if args.quick else 1
    messages = 1000 * args.size // divisor
    fan_messages = 100 * args.size // divisor
    members = ROOM_MEMBERS // divisor
    ca = TestCertificateAuthority()
    fakes = [FakeServer(work, ca) for _ in range(FANOUT_DESTINATIONS + 3)]
    loader, filler, listeners = fakes[0], fakes[1], fakes[2 : 2 + FANOUT_DESTINATIONS]
    results: dict[str, Any] = {
        "sizes": {"inbound_messages": messages, "fanout_messages": fan_messages},
        "inbound_send": {},
        "fanout": {},
        "join_1000": {"members": members, "resident": "roomstream (SQLite)"},
    }
    async with contextlib.AsyncExitStack() as stack:
        for fake in fakes:
            await fake.start()
            stack.push_async_callback(fake.close)
        targets: list[Target] = []
        resident = await stack.enter_async_context(
            roomstream_server(work, "roomstream_sqlite", ca, _sqlite(work, "roomstream_sqlite"))
        )
        targets.append(roomstream_target(resident, "roomstream_sqlite"))
        if args.postgres:
            pg = DatabaseConfig(engine="postgres", dsn=stack.enter_context(pg_database()))
            server = await stack.enter_async_context(
                roomstream_server(work, "roomstream_postgres", ca, pg)
            )
            targets.append(roomstream_target(server, "roomstream_postgres"))
        if args.synapse:
            pair = ca.issue("127.0.0.1")
            (work / "synapse.crt").write_bytes(pair.certificate_pem)
            (work / "synapse.key").write_bytes(pair.private_key_pem)
            peer = await stack.enter_async_context(
                synapse_peer(work / "synapse", work / "synapse.crt", work / "synapse.key")
            )
            targets.append(synapse_target(peer))

        for target in targets:
            print(f"--- inbound /send -> {target.label}", flush=True)
            results["inbound_send"][target.label] = await inbound_send(target, loader, messages)
            print(f"    {results['inbound_send'][target.label]}", flush=True)
        for target in targets:
            print(f"--- fan-out to {len(listeners)} -> {target.label}", flush=True)
            results["fanout"][target.label] = await fanout(target, listeners, fan_messages)
            print(f"    {results['fanout'][target.label]}", flush=True)

        print(f"--- a {members}-member room on the roomstream resident", flush=True)
        resident_target = targets[0]
        with common.timed() as built:
            room_id, _ = await big_room(resident_target, filler, members)
        results["join_1000"]["build_seconds"] = round(built.seconds, 1)
        joiner = await stack.enter_async_context(
            roomstream_server(work, "joiner_sqlite", ca, _sqlite(work, "joiner_sqlite"))
        )
        joiners = [roomstream_target(joiner, "roomstream_sqlite"), *targets[1:]]
        for target in joiners:
            print(f"--- join of the {members}-member room -> {target.label}", flush=True)
            results["join_1000"][target.label] = await join_remote(
                target, resident_target.server_name, room_id
            )
            print(f"    {results['join_1000'][target.label]}", flush=True)

        if args.synapse:
            # The same kind of room held by a second Synapse: Synapse joining Synapse
            # (faster joins: a partial-state join, completed in the background), and
            # roomstream joining a Synapse-held room.
            pair = ca.issue("127.0.0.1")
            (work / "resident.crt").write_bytes(pair.certificate_pem)
            (work / "resident.key").write_bytes(pair.private_key_pem)
            other = await stack.enter_async_context(
                synapse_peer(
                    work / "synapse_resident", work / "resident.crt", work / "resident.key"
                )
            )
            synapse_resident = Target(
                "synapse_resident", other.server_name, other.call, other.register
            )
            print(f"--- a {members}-member room on a Synapse resident", flush=True)
            section: dict[str, Any] = {"members": members, "resident": "Synapse (SQLite)"}
            with common.timed() as built:
                room_id, _ = await big_room(synapse_resident, fakes[-1], members)
            section["build_seconds"] = round(built.seconds, 1)
            synapses = [t for t in joiners if t.label.startswith("synapse")]
            for target in [*synapses, joiners[0]]:
                print(f"--- join of the Synapse-held room -> {target.label}", flush=True)
                section[target.label] = await join_remote(
                    target, synapse_resident.server_name, room_id
                )
                print(f"    {section[target.label]}", flush=True)
            results["join_1000_synapse_resident"] = section
    return results


def summary(results: dict[str, Any]) -> str:
    rows = []
    for label, r in results["inbound_send"].items():
        rows.append(["inbound /send", label, f"{r['pdus_per_second']:,.0f} PDUs/s"])
    for label, r in results["fanout"].items():
        rows.append([f"fan-out x{r['destinations']}", label, f"{r['seconds']:.2f} s"])
    for key, held_by in (("join_1000", "roomstream"), ("join_1000_synapse_resident", "Synapse")):
        section = results.get(key, {})
        for label, r in section.items():
            if isinstance(r, dict):
                scenario = f"join ({section['members']} members, held by {held_by})"
                rows.append([scenario, label, f"{r['seconds']:.2f} s"])
    return common.markdown_table(["scenario", "target", "figure"], rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="sizes divided by 5")
    parser.add_argument("--size", type=int, default=1, help="multiply M and K")
    parser.add_argument("--no-synapse", dest="synapse", action="store_false")
    parser.add_argument("--postgres", action="store_true", help="also roomstream on PostgreSQL")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fedbench-") as where:
        results = asyncio.run(run(args, Path(where)))
    print(summary(results))
    path = common.write_results("federation", results, args.quick)
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
