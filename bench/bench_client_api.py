"""The Client-Server API, driven by URL with the same scenarios against any homeserver.

Usage::

    python bench/bench_client_api.py [--quick] [--target NAME ... | --only WORD ...] [--url URL ...]
                                     [--profile SCENARIO]

With no ``--url`` it starts, one after the other, roomstream on SQLite and on PostgreSQL
(``roomstream run`` on loopback ports, throwaway databases) and, when the ``bench`` extra
brought it, Synapse on SQLite and (with ``psycopg2``) on PostgreSQL, configured as
``shared/peers/synapse/config_patch.py`` does (rate limiters out of the way, presence off
unless ``presence_wake`` runs, cheap password hashing), and waits for Synapse's background
schema updates before measuring. Every server gets the same requests from the same plain
aiohttp client:

- ``send_seq``: sequential ``PUT /send`` in one room (events/s);
- ``send_16_rooms`` / ``send_16_shared``: 16 users sending concurrently, each in its own
  room / all in one room (events/s);
- ``sync_wake``: user B long-polls ``/sync``; the time from the start of A's send to B's
  response carrying that event (ms, p50 and p99);
- ``initial_sync`` / ``initial_sync_limit5``: ``/sync`` without ``since`` of a user in R
  rooms x E messages, unfiltered and with the inline filter ``room.timeline.limit`` 5
  (ms; first call and median of the repeats);
- ``messages``: ``/messages`` walking back (``dir=b``, ``limit=50``) through a room of M
  messages, from its end to its creation (events/s; first walk and median);
- ``state``: ``GET /rooms/{id}/state`` of a room with S joined members (ms, median);
- ``keys_query``: one client's ``POST /keys/query`` for U users of 3 devices each, every
  device with ed25519-signed device keys (ms, median; queries/s);
- ``keys_claim``: ``POST /keys/claim`` of one ``signed_curve25519`` key from each of D
  devices in one request (ms, median);
- ``to_device_wake``: user B long-polls ``/sync``; the time from the start of A's
  ``PUT /sendToDevice`` to B's response carrying that message (ms, p50 and p99);
- ``media``: upload (``POST /_matrix/media/v3/upload``, thumbnails made by the server
  included) then authenticated download of distinct 1 MB PNGs, one at a time (MB/s:
  upload, download, and the round trip of both), then a 96x96 ``crop`` thumbnail of
  each, made at upload by both servers (ms, median).
- ``profile_fanout``: a user joined to R rooms changes their display name; the time from
  the start of the ``PUT /profile/{userId}/displayname`` until a room-mate's ``/sync``
  long polls have brought the new ``m.room.member`` event of all R rooms (ms, median of
  the repeats; the ``PUT``'s own time too);
- ``presence_wake``: user B long-polls ``/sync``; the time from the start of A's
  ``PUT /presence/{userId}/status`` (online and unavailable in turn, a new
  ``status_msg`` each time) to B's response carrying it (ms, p50 and p99);
- ``relations_thread``: a thread root with N ``m.thread`` replies; ``GET
  /relations/{root}/m.thread`` with ``limit`` N and with ``limit`` 50 (ms, median);
- ``search``: a room of M messages, one in M/H carrying the term; ``POST /search`` for
  it in that room, ``order_by`` ``rank`` and ``recent`` (ms, median).

Set-up (users, rooms, the messages and members the read scenarios need) is not measured
and runs as concurrently as each server takes it. Each scenario checks the answers it
times (room count, timeline lengths, events walked, state size, every device's keys, one
distinct one-time key per device per claim), so a server cannot look fast by answering
less. ``--profile SCENARIO`` samples the roomstream server with py-spy during that
scenario and prints where its time goes. Registration must be open on a ``--url`` server.
Results: ``bench/results/client_api.json`` (another stem with ``--name``), with
roomstream/Synapse ratios (above 1 means roomstream is better).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import io
import os
import random
import shutil
import signal
import socket
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psycopg
import yaml
from psycopg import sql
from signedjson.key import generate_signing_key, get_verify_key
from signedjson.sign import sign_json
from unpaddedbase64 import encode_base64

import common

SIZES: dict[str, dict[str, int]] = {
    "full": {
        "seq": 500,
        "conc": 800,  # 16 senders x 50
        "wake": 100,
        "rooms": 100,
        "events": 20,
        "msgs": 2000,
        "members": 500,
        "sync_repeats": 9,
        "walk_repeats": 5,
        "state_repeats": 50,
        "key_users": 100,  # x KEY_DEVICES devices each
        "query_repeats": 50,
        "claim_devices": 100,
        "claim_repeats": 50,
        "td_wake": 100,
        "media_repeats": 20,
        "profile_rooms": 100,
        "profile_repeats": 5,
        "presence_wake": 100,
        "thread_replies": 1000,
        "relations_repeats": 20,
        "search_msgs": 100_000,
        "search_hits": 100,
        "search_repeats": 20,
    },
    "quick": {
        "seq": 100,
        "conc": 160,
        "wake": 20,
        "rooms": 20,
        "events": 10,
        "msgs": 400,
        "members": 50,
        "sync_repeats": 3,
        "walk_repeats": 3,
        "state_repeats": 10,
        "key_users": 20,
        "query_repeats": 10,
        "claim_devices": 20,
        "claim_repeats": 10,
        "td_wake": 20,
        "media_repeats": 5,
        "profile_rooms": 20,
        "profile_repeats": 2,
        "presence_wake": 20,
        "thread_replies": 100,
        "relations_repeats": 5,
        "search_msgs": 2000,
        "search_hits": 20,
        "search_repeats": 5,
    },
}
SENDERS = 16
#: Devices per user in ``keys_query`` (each one a login).
KEY_DEVICES = 3
#: The password of the users that log in (``keys_query``): set-up only.
PASSWORD = "bench-pw"
#: Concurrency of the unmeasured set-up requests.
SETUP_CONCURRENCY = 16
WARMUP_SENDS = 10

#: Scenario -> (result key, higher is better) for the ratios.
HEADLINES: dict[str, tuple[str, bool]] = {
    "send_seq": ("send_seq_events_per_s", True),
    "send_16_rooms": ("send_16_rooms_events_per_s", True),
    "send_16_shared": ("send_16_shared_events_per_s", True),
    "sync_wake_p50": ("sync_wake_ms_p50", False),
    "sync_wake_p99": ("sync_wake_ms_p99", False),
    "initial_sync": ("initial_sync_ms_p50", False),
    "initial_sync_limit5": ("initial_sync_limit5_ms_p50", False),
    "messages": ("messages_events_per_s", True),
    "state": ("state_ms_p50", False),
    "keys_query": ("keys_query_ms_p50", False),
    "keys_claim": ("keys_claim_ms_p50", False),
    "to_device_wake_p50": ("to_device_wake_ms_p50", False),
    "to_device_wake_p99": ("to_device_wake_ms_p99", False),
    "media_round_trip": ("media_round_trip_mb_per_s", True),
    "media_upload": ("media_upload_mb_per_s", True),
    "media_download": ("media_download_mb_per_s", True),
    "thumbnail": ("thumbnail_ms_p50", False),
    "profile_fanout": ("profile_fanout_ms_p50", False),
    "presence_wake_p50": ("presence_wake_ms_p50", False),
    "presence_wake_p99": ("presence_wake_ms_p99", False),
    "relations_thread": ("relations_thread_ms_p50", False),
    "relations_thread_page50": ("relations_thread_page50_ms_p50", False),
    "search_rank": ("search_rank_ms_p50", False),
    "search_recent": ("search_recent_ms_p50", False),
}
#: roomstream on SQLite must reach these (issue 11, section 5).
TARGETS: dict[str, tuple[str, float]] = {
    "send_seq_events_per_s": (">=", 1000),
    "send_16_rooms_events_per_s": (">=", 2500),
    "send_16_shared_events_per_s": (">=", 2500),
    "sync_wake_ms_p50": ("<=", 2),
    "initial_sync_ms_p50": ("<=", 30),
    "initial_sync_limit5_ms_p50": ("<=", 30),
    "messages_events_per_s": (">=", 40000),
    "state_ms_p50": ("<=", 1),
}
#: roomstream on SQLite must be at least this many times Synapse on SQLite, by headline
#: ratio (issue 19, section 3).
RATIO_TARGETS: dict[str, float] = {
    "keys_query": 10,
    "keys_claim": 10,
    "to_device_wake_p50": 10,
    # issue 21, section 7.
    "media_round_trip": 5,
    "thumbnail": 5,
    # issue 20, section 4.
    "profile_fanout": 10,
    "presence_wake_p50": 10,
    # issue 21, section 7.
    "relations_thread": 5,
    "relations_thread_page50": 5,
    "search_rank": 5,
    "search_recent": 5,
}
SCENARIOS = (
    "send_seq",
    "send_16",
    "sync_wake",
    "initial_sync",
    "messages",
    "state",
    "keys_query",
    "keys_claim",
    "to_device_wake",
    "media",
    "profile_fanout",
    "presence_wake",
    "relations_thread",
    "search",
)
#: The timed parts of the scenarios (what ``--profile`` can sample).
TIMED_PARTS = (
    "send_seq",
    "send_16_rooms",
    "send_16_shared",
    "sync_wake",
    "initial_sync",
    "initial_sync_limit5",
    "messages",
    "state",
    "keys_query",
    "keys_claim",
    "to_device_wake",
    "media_upload",
    "media_download",
    "thumbnail",
    "profile_fanout",
    "presence_wake",
    "relations_thread",
    "relations_thread_page50",
    "search_rank",
    "search_recent",
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1000


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile (``pct`` in 0-100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, round(pct / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass(frozen=True)
class User:
    user_id: str
    token: str
    device_id: str = ""


class HTTPError(RuntimeError):
    def __init__(self, method: str, path: str, status: int, body: bytes) -> None:
        super().__init__(f"{method} {path}: {status} {body[:300]!r}")
        self.status = status
        self.body = body


@dataclass
class Client:
    """A thin Client-Server API client: raw HTTP and orjson, so the client's own cost stays
    small and is the same for every server."""

    base: str
    session: aiohttp.ClientSession
    txn: list[int] = field(default_factory=lambda: [0])
    needs_password: list[bool] = field(default_factory=lambda: [False])

    async def call(
        self,
        method: str,
        path: str,
        token: str | None = None,
        body: Any = None,
        api: str = "v3",
        **query: Any,
    ) -> Any:
        """``method`` on ``/_matrix/client/{api}{path}``; the decoded JSON answer."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if body is not None:
            headers["Content-Type"] = "application/json"
        data = None if body is None else orjson.dumps(body)
        url = f"{self.base}/_matrix/client/{api}{path}"
        params = {k: str(v) for k, v in query.items() if v is not None}
        for _ in range(50):
            async with self.session.request(
                method, url, data=data, headers=headers, params=params
            ) as resp:
                raw = await resp.read()
                if resp.status == 429:  # a limiter left on: back off as told (set-up only)
                    wait = orjson.loads(raw).get("retry_after_ms", 100)
                    await asyncio.sleep(wait / 1000)
                    continue
                if resp.status != 200:
                    raise HTTPError(method, path, resp.status, raw)
                return orjson.loads(raw)
        raise RuntimeError(f"{method} {path}: still rate limited")

    async def register(self, name: str) -> User:
        # Without a password if the server takes it (roomstream: nothing to hash, as its
        # argon2 costs tens of ms); Synapse requires one (cheap: bcrypt_rounds 4). Set-up
        # only: the benchmark users never log in again.
        body: dict[str, Any] = {"username": name, "auth": {"type": "m.login.dummy"}}
        if self.needs_password[0]:
            body["password"] = "bench-pw"
        try:
            result = await self.call("POST", "/register", body=body)
        except HTTPError as exc:
            if exc.status != 400 or "password" in body or b"M_MISSING_PARAM" not in exc.body:
                raise
            self.needs_password[0] = True
            return await self.register(name)
        return User(result["user_id"], result["access_token"], result.get("device_id", ""))

    async def register_for_login(self, name: str) -> str:
        """A user with a password and no device yet (``inhibit_login``); its ID."""
        body = {
            "username": name,
            "password": PASSWORD,
            "inhibit_login": True,
            "auth": {"type": "m.login.dummy"},
        }
        return str((await self.call("POST", "/register", body=body))["user_id"])

    async def login(self, user_id: str) -> User:
        """A new device of ``user_id`` (registered by :meth:`register_for_login`)."""
        body = {
            "type": "m.login.password",
            "identifier": {"type": "m.id.user", "user": user_id},
            "password": PASSWORD,
        }
        result = await self.call("POST", "/login", body=body)
        return User(result["user_id"], result["access_token"], result["device_id"])

    async def create_room(self, user: User) -> str:
        body = {"preset": "public_chat"}
        return str((await self.call("POST", "/createRoom", user.token, body))["room_id"])

    async def send(self, user: User, room_id: str, text: str) -> str:
        self.txn[0] += 1
        path = f"/rooms/{room_id}/send/m.room.message/b{self.txn[0]}"
        result = await self.call("PUT", path, user.token, {"msgtype": "m.text", "body": text})
        return str(result["event_id"])

    async def join(self, user: User, room_id: str) -> None:
        await self.call("POST", f"/rooms/{room_id}/join", user.token, {})

    async def sync(self, user: User, **query: Any) -> dict[str, Any]:
        result: dict[str, Any] = await self.call("GET", "/sync", user.token, **query)
        return result


async def bounded(n: int, coros: list[Coroutine[Any, Any, Any]]) -> list[Any]:
    """Run ``coros`` with at most ``n`` in flight; results in order."""
    semaphore = asyncio.Semaphore(n)

    async def one(coro: Coroutine[Any, Any, Any]) -> Any:
        async with semaphore:
            return await coro

    return await asyncio.gather(*(one(c) for c in coros))


def timeline_ids(response: dict[str, Any], room_id: str) -> list[str]:
    room = response.get("rooms", {}).get("join", {}).get(room_id, {})
    return [e["event_id"] for e in room.get("timeline", {}).get("events", [])]


# -- scenarios -------------------------------------------------------------------------
#
# Each takes the client, the sizes, a fresh name tag and a hook that brackets the timed
# part (for --profile); set-up happens before the hook opens.

Hook = Callable[[str], contextlib.AbstractAsyncContextManager[None]]


@contextlib.asynccontextmanager
async def null_hook(name: str) -> AsyncIterator[None]:
    """A hook that does nothing (no profiling)."""
    yield


async def send_seq(client: Client, sizes: dict[str, int], tag: str, hook: Hook) -> dict[str, Any]:
    alice = await client.register(f"seq{tag}")
    room = await client.create_room(alice)
    for i in range(WARMUP_SENDS):
        await client.send(alice, room, f"warm-up {i}")
    async with hook("send_seq"):
        started = time.perf_counter()
        for i in range(sizes["seq"]):
            await client.send(alice, room, f"seq {i}")
        seconds = time.perf_counter() - started
    return {"send_seq_events_per_s": sizes["seq"] / seconds}


async def send_16(client: Client, sizes: dict[str, int], tag: str, hook: Hook) -> dict[str, Any]:
    senders = await bounded(
        SETUP_CONCURRENCY, [client.register(f"s{i}x{tag}") for i in range(SENDERS)]
    )
    own_rooms = await bounded(SETUP_CONCURRENCY, [client.create_room(s) for s in senders])
    shared = await client.create_room(senders[0])
    await bounded(SETUP_CONCURRENCY, [client.join(s, shared) for s in senders[1:]])
    per = sizes["conc"] // SENDERS
    results: dict[str, Any] = {}

    async def burst(user: User, room_id: str, label: str) -> None:
        for i in range(per):
            await client.send(user, room_id, f"{label} {i}")

    for name, rooms in (("send_16_rooms", own_rooms), ("send_16_shared", [shared] * SENDERS)):
        pairs = list(zip(senders, rooms, strict=True))
        await asyncio.gather(*(client.send(s, r, "warm-up") for s, r in pairs))
        async with hook(name):
            started = time.perf_counter()
            await asyncio.gather(*(burst(s, r, name) for s, r in pairs))
            seconds = time.perf_counter() - started
        results[f"{name}_events_per_s"] = per * SENDERS / seconds
    return results


async def sync_wake(client: Client, sizes: dict[str, int], tag: str, hook: Hook) -> dict[str, Any]:
    alice = await client.register(f"wa{tag}")
    bob = await client.register(f"wb{tag}")
    room = await client.create_room(alice)
    await client.join(bob, room)
    since = (await client.sync(bob, timeout=0))["next_batch"]
    latencies: list[float] = []
    async with hook("sync_wake"):
        for i in range(sizes["wake"]):
            poll = asyncio.create_task(client.sync(bob, since=since, timeout=30000))
            # Give the long poll time to park on the server (not measured). Were it late,
            # the latency would still count from the send's start to the answer.
            await asyncio.sleep(0.03)
            started = time.perf_counter()
            event_id = await client.send(alice, room, f"wake {i}")
            response = await poll
            while event_id not in timeline_ids(response, room):  # woken by something else
                since = response["next_batch"]
                response = await client.sync(bob, since=since, timeout=30000)
            latencies.append(ms_since(started))
            since = response["next_batch"]
    return {
        "sync_wake_ms_p50": statistics.median(latencies),
        "sync_wake_ms_p99": percentile(latencies, 99),
        "sync_wake_ms_max": max(latencies),
    }


async def initial_sync(
    client: Client, sizes: dict[str, int], tag: str, hook: Hook
) -> dict[str, Any]:
    carol = await client.register(f"is{tag}")
    rooms = await bounded(
        SETUP_CONCURRENCY, [client.create_room(carol) for _ in range(sizes["rooms"])]
    )
    await bounded(
        SETUP_CONCURRENCY,
        [client.send(carol, r, f"e {i}") for i in range(sizes["events"]) for r in rooms],
    )
    results: dict[str, Any] = {}
    limit5 = orjson.dumps({"room": {"timeline": {"limit": 5}}}).decode()
    for name, query, expect in (
        ("initial_sync", {}, 10),  # the spec's and both servers' default timeline limit
        ("initial_sync_limit5", {"filter": limit5}, 5),
    ):
        times = []
        async with hook(name):
            for i in range(sizes["sync_repeats"]):
                started = time.perf_counter()
                # A distinct ``timeout`` each time (ignored without ``since``) keeps every
                # call out of Synapse's 2-minute /sync response cache: measured is the
                # work of an initial sync, not a replay of the previous one.
                response = await client.sync(carol, timeout=i, **query)
                times.append(ms_since(started))
        joined = response["rooms"]["join"]
        lengths = {len(timeline_ids(response, r)) for r in rooms}
        if len(joined) != len(rooms) or lengths != {expect}:
            raise RuntimeError(f"{name}: {len(joined)} rooms, timeline lengths {lengths}")
        results[f"{name}_ms_first"] = times[0]
        results[f"{name}_ms_p50"] = statistics.median(times)
    return results


async def messages(client: Client, sizes: dict[str, int], tag: str, hook: Hook) -> dict[str, Any]:
    dave = await client.register(f"ms{tag}")
    room = await client.create_room(dave)
    await bounded(
        SETUP_CONCURRENCY, [client.send(dave, room, f"h {i}") for i in range(sizes["msgs"])]
    )
    rates, walked = [], 0
    async with hook("messages"):
        for _ in range(sizes["walk_repeats"]):
            started = time.perf_counter()
            walked, token = 0, None
            while True:
                page = await client.call(
                    "GET",
                    f"/rooms/{room}/messages",
                    dave.token,
                    dir="b",
                    limit=50,
                    **({"from": token} if token else {}),
                )
                walked += len(page["chunk"])
                token = page.get("end")
                if not token or not page["chunk"]:
                    break
            rates.append(walked / (time.perf_counter() - started))
    if walked < sizes["msgs"]:
        raise RuntimeError(f"messages: walked {walked} events of {sizes['msgs']}")
    return {
        "messages_events_per_s": statistics.median(rates),
        "messages_events_per_s_first": rates[0],
        "messages_walked": walked,
    }


async def state(client: Client, sizes: dict[str, int], tag: str, hook: Hook) -> dict[str, Any]:
    erin = await client.register(f"st{tag}")
    room = await client.create_room(erin)
    members = await bounded(
        SETUP_CONCURRENCY, [client.register(f"m{i}x{tag}") for i in range(sizes["members"] - 1)]
    )
    await bounded(SETUP_CONCURRENCY, [client.join(m, room) for m in members])
    times = []
    async with hook("state"):
        for _ in range(sizes["state_repeats"]):
            started = time.perf_counter()
            events = await client.call("GET", f"/rooms/{room}/state", erin.token)
            times.append(ms_since(started))
    joined = sum(
        1
        for e in events
        if e["type"] == "m.room.member" and e["content"].get("membership") == "join"
    )
    if joined != sizes["members"]:
        raise RuntimeError(f"state: {joined} joined members of {sizes['members']}")
    return {"state_ms_p50": statistics.median(times), "state_events": len(events)}


class DeviceKeys:
    """A device's ed25519 identity key and the key objects it signs, as a client makes
    them (the server checks the self-signature of device keys)."""

    def __init__(self, user: User) -> None:
        self.user = user
        self.signing_key = generate_signing_key(user.device_id)

    def _public(self, key: bytes) -> str:
        return encode_base64(key)

    def device_keys(self) -> dict[str, Any]:
        device = self.user.device_id
        ed25519 = self._public(get_verify_key(self.signing_key).encode())
        keys = {
            "user_id": self.user.user_id,
            "device_id": device,
            "algorithms": ["m.olm.v1.curve25519-aes-sha2", "m.megolm.v1.aes-sha2"],
            "keys": {
                # Any 32 bytes stand for the Curve25519 key: the server never uses it.
                f"curve25519:{device}": self._public(os.urandom(32)),
                f"ed25519:{device}": ed25519,
            },
        }
        return sign_json(keys, self.user.user_id, self.signing_key)

    def one_time_keys(self, count: int) -> dict[str, Any]:
        return {
            f"signed_curve25519:AAAA{i:04d}": sign_json(
                {"key": self._public(os.urandom(32))}, self.user.user_id, self.signing_key
            )
            for i in range(count)
        }

    async def upload(self, client: Client, one_time_keys: int = 0) -> dict[str, Any]:
        body: dict[str, Any] = {"device_keys": self.device_keys()}
        if one_time_keys:
            body["one_time_keys"] = self.one_time_keys(one_time_keys)
        result: dict[str, Any] = await client.call("POST", "/keys/upload", self.user.token, body)
        return result


async def keys_query(client: Client, sizes: dict[str, int], tag: str, hook: Hook) -> dict[str, Any]:
    user_ids = await bounded(
        SETUP_CONCURRENCY,
        [client.register_for_login(f"kq{i}x{tag}") for i in range(sizes["key_users"])],
    )
    devices = await bounded(
        SETUP_CONCURRENCY, [client.login(u) for u in user_ids for _ in range(KEY_DEVICES)]
    )
    signers = [DeviceKeys(d) for d in devices]
    await bounded(SETUP_CONCURRENCY, [s.upload(client) for s in signers])
    expected = {(d.user_id, d.device_id): s for d, s in zip(devices, signers, strict=True)}
    querier = devices[0]
    body: dict[str, Any] = {"device_keys": {u: [] for u in user_ids}}
    await client.call("POST", "/keys/query", querier.token, body)  # warm-up
    times = []
    async with hook("keys_query"):
        started_all = time.perf_counter()
        for _ in range(sizes["query_repeats"]):
            started = time.perf_counter()
            answer = await client.call("POST", "/keys/query", querier.token, body)
            times.append(ms_since(started))
        seconds = time.perf_counter() - started_all
    got = {
        (user_id, device_id): keys
        for user_id, by_device in answer["device_keys"].items()
        for device_id, keys in by_device.items()
    }
    if set(got) != set(expected):
        raise RuntimeError(f"keys_query: {len(got)} devices' keys of {len(expected)}")
    for (user_id, device_id), keys in got.items():
        own = keys.get("signatures", {}).get(user_id, {}).get(f"ed25519:{device_id}")
        if keys.get("keys") is None or not own:
            raise RuntimeError(f"keys_query: {user_id} {device_id}: keys or signature missing")
    return {
        "keys_query_ms_p50": statistics.median(times),
        "keys_query_per_s": sizes["query_repeats"] / seconds,
        "keys_query_devices": len(got),
    }


async def keys_claim(client: Client, sizes: dict[str, int], tag: str, hook: Hook) -> dict[str, Any]:
    repeats = sizes["claim_repeats"]
    devices = await bounded(
        SETUP_CONCURRENCY,
        [client.register(f"kc{i}x{tag}") for i in range(sizes["claim_devices"])],
    )
    # One key per device for the warm-up claim, one per measured claim.
    await bounded(SETUP_CONCURRENCY, [DeviceKeys(d).upload(client, repeats + 1) for d in devices])
    claimer = await client.register(f"kcc{tag}")
    body = {
        "one_time_keys": {d.user_id: {d.device_id: "signed_curve25519"} for d in devices},
    }
    answers = [await client.call("POST", "/keys/claim", claimer.token, body)]  # warm-up
    times = []
    async with hook("keys_claim"):
        for _ in range(repeats):
            started = time.perf_counter()
            answers.append(await client.call("POST", "/keys/claim", claimer.token, body))
            times.append(ms_since(started))
    handed_out: set[tuple[str, str, str]] = set()
    for answer in answers:
        count = 0
        for user_id, by_device in answer["one_time_keys"].items():
            for device_id, keys in by_device.items():
                for key_id, key in keys.items():
                    if not key_id.startswith("signed_curve25519:") or "signatures" not in key:
                        raise RuntimeError(f"keys_claim: {user_id} {device_id}: {key_id} {key}")
                    handed_out.add((user_id, device_id, key_id))
                    count += 1
        if count != len(devices):
            raise RuntimeError(f"keys_claim: {count} keys claimed of {len(devices)}")
    if len(handed_out) != len(devices) * len(answers):
        raise RuntimeError("keys_claim: a one-time key was handed out twice")
    return {"keys_claim_ms_p50": statistics.median(times)}


async def to_device_wake(
    client: Client, sizes: dict[str, int], tag: str, hook: Hook
) -> dict[str, Any]:
    alice = await client.register(f"ta{tag}")
    bob = await client.register(f"tb{tag}")
    since = (await client.sync(bob, timeout=0))["next_batch"]

    def carried(response: dict[str, Any], nonce: str) -> bool:
        events = response.get("to_device", {}).get("events", [])
        return any(e.get("content", {}).get("nonce") == nonce for e in events)

    latencies: list[float] = []
    async with hook("to_device_wake"):
        for i in range(sizes["td_wake"]):
            poll = asyncio.create_task(client.sync(bob, since=since, timeout=30000))
            # As in sync_wake: time for the long poll to park (not measured).
            await asyncio.sleep(0.03)
            nonce = f"{tag}-{i}"
            client.txn[0] += 1
            message = {"messages": {bob.user_id: {bob.device_id: {"nonce": nonce}}}}
            started = time.perf_counter()
            await client.call(
                "PUT", f"/sendToDevice/m.bench.wake/t{client.txn[0]}", alice.token, message
            )
            response = await poll
            while not carried(response, nonce):  # woken by something else
                since = response["next_batch"]
                response = await client.sync(bob, since=since, timeout=30000)
            latencies.append(ms_since(started))
            since = response["next_batch"]
    return {
        "to_device_wake_ms_p50": statistics.median(latencies),
        "to_device_wake_ms_p99": percentile(latencies, 99),
        "to_device_wake_ms_max": max(latencies),
    }


#: Side of the benchmark's images: 580 x 580 RGB noise is a PNG of about 1 MB (noise does
#: not compress).
MEDIA_SIDE = 580


def noise_png(seed: int) -> bytes:
    """A PNG of about 1 MB that no other call returns (no server may deduplicate it)."""
    from PIL import Image

    raw = random.Random(seed).randbytes(MEDIA_SIDE * MEDIA_SIDE * 3)
    out = io.BytesIO()
    Image.frombytes("RGB", (MEDIA_SIDE, MEDIA_SIDE), raw).save(out, "PNG", compress_level=1)
    return out.getvalue()


async def media(client: Client, sizes: dict[str, int], tag: str, hook: Hook) -> dict[str, Any]:
    """Upload and download of a 1 MB PNG (the upload includes the server making its
    thumbnails, on both servers), one at a time; then a 96x96 crop thumbnail of each
    (made at upload by both)."""
    repeats = sizes["media_repeats"]
    user = await client.register(f"media{tag}")
    images = [noise_png(hash((tag, i))) for i in range(repeats + 1)]
    headers = {"Authorization": f"Bearer {user.token}", "Content-Type": "image/png"}
    auth = {"Authorization": f"Bearer {user.token}"}

    async def upload(image: bytes) -> str:
        url = f"{client.base}/_matrix/media/v3/upload?filename=noise.png"
        async with client.session.post(url, data=image, headers=headers) as resp:
            raw = await resp.read()
            if resp.status != 200:
                raise HTTPError("POST", "/upload", resp.status, raw)
            return str(orjson.loads(raw)["content_uri"]).removeprefix("mxc://")

    async def fetch(path: str) -> bytes:
        async with client.session.get(f"{client.base}{path}", headers=auth) as resp:
            raw = await resp.read()
            if resp.status != 200:
                raise HTTPError("GET", path, resp.status, raw)
            return raw

    download = "/_matrix/client/v1/media/download/"
    warm = await upload(images[0])  # warm-up
    await fetch(download + warm)
    ups, downs, uris = [], [], []
    async with hook("media_upload"):
        for image in images[1:]:
            started = time.perf_counter()
            uris.append(await upload(image))
            ups.append(time.perf_counter() - started)
    async with hook("media_download"):
        for uri, image in zip(uris, images[1:], strict=True):
            started = time.perf_counter()
            got = await fetch(download + uri)
            downs.append(time.perf_counter() - started)
            if got != image:
                raise RuntimeError(f"media: {uri} downloaded {len(got)} bytes, not the upload")
    thumbs = []
    async with hook("thumbnail"):
        for uri in uris:
            started = time.perf_counter()
            await fetch(f"/_matrix/client/v1/media/thumbnail/{uri}?width=96&height=96&method=crop")
            thumbs.append(ms_since(started))
    megabytes = statistics.mean(len(i) for i in images) / 1e6
    return {
        "media_image_mb": round(megabytes, 3),
        "media_upload_mb_per_s": megabytes / statistics.median(ups),
        "media_download_mb_per_s": megabytes / statistics.median(downs),
        "media_round_trip_mb_per_s": megabytes
        / statistics.median(u + d for u, d in zip(ups, downs, strict=True)),
        "thumbnail_ms_p50": statistics.median(thumbs),
    }


def member_updates(response: dict[str, Any], user_id: str, displayname: str) -> set[str]:
    """The rooms in a ``/sync`` response whose timeline or state carries ``user_id``'s
    join event with ``displayname``."""
    found = set()
    for room_id, room in response.get("rooms", {}).get("join", {}).items():
        events = [
            *room.get("timeline", {}).get("events", []),
            *room.get("state", {}).get("events", []),
        ]
        for event in events:
            content = event.get("content", {})
            if (
                event.get("type") == "m.room.member"
                and event.get("state_key") == user_id
                and content.get("membership") == "join"
                and content.get("displayname") == displayname
            ):
                found.add(room_id)
    return found


async def profile_fanout(
    client: Client, sizes: dict[str, int], tag: str, hook: Hook
) -> dict[str, Any]:
    """A user joined to R rooms changes their display name; the time from the start of
    the ``PUT /profile/{userId}/displayname`` until a room-mate's ``/sync`` long polls
    have brought the new ``m.room.member`` event of every one of the R rooms."""
    alice = await client.register(f"pa{tag}")
    bob = await client.register(f"pb{tag}")
    rooms = await bounded(
        SETUP_CONCURRENCY, [client.create_room(bob) for _ in range(sizes["profile_rooms"])]
    )
    await bounded(SETUP_CONCURRENCY, [client.join(alice, r) for r in rooms])
    since = (await client.sync(bob, timeout=0))["next_batch"]
    wanted = set(rooms)
    totals: list[float] = []
    puts: list[float] = []
    async with hook("profile_fanout"):
        for i in range(sizes["profile_repeats"]):
            name = f"Alice {tag} {i}"

            async def collect(since: str, name: str) -> str:
                seen: set[str] = set()
                deadline = time.monotonic() + 300
                while not wanted <= seen:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"profile_fanout: {len(seen)} rooms of {len(wanted)}")
                    response = await client.sync(bob, since=since, timeout=30000)
                    seen |= member_updates(response, alice.user_id, name)
                    since = response["next_batch"]
                return since

            poll = asyncio.create_task(collect(since, name))
            # As in sync_wake: time for the long poll to park (not measured).
            await asyncio.sleep(0.03)
            started = time.perf_counter()
            await client.call(
                "PUT",
                f"/profile/{alice.user_id}/displayname",
                alice.token,
                {"displayname": name},
            )
            puts.append(ms_since(started))
            since = await poll
            totals.append(ms_since(started))
    return {
        "profile_fanout_ms_p50": statistics.median(totals),
        "profile_fanout_ms_max": max(totals),
        "profile_put_ms_p50": statistics.median(puts),
        "profile_fanout_rooms": len(wanted),
    }


async def presence_wake(
    client: Client, sizes: dict[str, int], tag: str, hook: Hook
) -> dict[str, Any]:
    """User B long-polls ``/sync``; A (in a room with B) sets its presence, toggling
    ``online``/``unavailable`` with a new ``status_msg`` each time; the time from the
    start of A's ``PUT /presence/{userId}/status`` to B's response carrying it."""
    alice = await client.register(f"ra{tag}")
    bob = await client.register(f"rb{tag}")
    room = await client.create_room(alice)
    await client.join(bob, room)
    since = (await client.sync(bob, timeout=0))["next_batch"]

    def carried(response: dict[str, Any], nonce: str) -> bool:
        events = response.get("presence", {}).get("events", [])
        return any(
            e.get("sender") == alice.user_id and e.get("content", {}).get("status_msg") == nonce
            for e in events
        )

    latencies: list[float] = []
    async with hook("presence_wake"):
        for i in range(sizes["presence_wake"]):
            poll = asyncio.create_task(client.sync(bob, since=since, timeout=30000))
            # As in sync_wake: time for the long poll to park (not measured).
            await asyncio.sleep(0.03)
            nonce = f"{tag}-{i}"
            body = {"presence": ("online", "unavailable")[i % 2], "status_msg": nonce}
            started = time.perf_counter()
            await client.call("PUT", f"/presence/{alice.user_id}/status", alice.token, body)
            response = await poll
            while not carried(response, nonce):  # woken by something else
                since = response["next_batch"]
                response = await client.sync(bob, since=since, timeout=30000)
            latencies.append(ms_since(started))
            since = response["next_batch"]
    return {
        "presence_wake_ms_p50": statistics.median(latencies),
        "presence_wake_ms_p99": percentile(latencies, 99),
        "presence_wake_ms_max": max(latencies),
    }


async def timed_calls(repeats: int, call: Callable[[], Awaitable[Any]]) -> tuple[list[float], Any]:
    """``call`` once untimed (warm-up), then ``repeats`` times timed: the times (ms) and
    the last answer."""
    answer = await call()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        answer = await call()
        times.append(ms_since(started))
    return times, answer


async def relations_thread(
    client: Client, sizes: dict[str, int], tag: str, hook: Hook
) -> dict[str, Any]:
    """A thread root with N ``m.thread`` replies (sent concurrently, set-up); then
    ``GET /_matrix/client/v1/rooms/{id}/relations/{root}/m.thread`` with ``limit`` N (all
    of them in one answer) and with ``limit`` 50 (the first page), each repeated (median
    ms). Both answers are checked: every reply, newest first, and a ``next_batch``."""
    n = sizes["thread_replies"]
    user = await client.register(f"rt{tag}")
    room = await client.create_room(user)
    root = await client.send(user, room, "thread root")

    async def reply(i: int) -> str:
        client.txn[0] += 1
        content = {
            "msgtype": "m.text",
            "body": f"reply {i}",
            "m.relates_to": {
                "rel_type": "m.thread",
                "event_id": root,
                "is_falling_back": True,
                "m.in_reply_to": {"event_id": root},
            },
        }
        path = f"/rooms/{room}/send/m.room.message/r{client.txn[0]}"
        return str((await client.call("PUT", path, user.token, content))["event_id"])

    replies = set(await bounded(SETUP_CONCURRENCY, [reply(i) for i in range(n)]))
    path = f"/rooms/{room}/relations/{root}/m.thread"
    results: dict[str, Any] = {}
    for name, limit in (("relations_thread", n), ("relations_thread_page50", 50)):

        def page(limit: int = limit) -> Awaitable[Any]:
            return client.call("GET", path, user.token, api="v1", limit=limit)

        async with hook(name):
            times, answer = await timed_calls(sizes["relations_repeats"], page)
        chunk = [e["event_id"] for e in answer["chunk"]]
        if len(chunk) != min(limit, n) or not set(chunk) <= replies:
            raise RuntimeError(f"{name}: {len(chunk)} events, not {min(limit, n)} replies")
        if limit < n and not answer.get("next_batch"):
            raise RuntimeError(f"{name}: no next_batch after {limit} of {n} replies")
        results[f"{name}_ms_first"] = times[0]
        results[f"{name}_ms_p50"] = statistics.median(times)
    results["relations_thread_replies"] = n
    return results


#: Words of the ``search`` scenario's messages; the term searched for is not one of them.
SEARCH_WORDS = [
    "apple",
    "bridge",
    "candle",
    "dragon",
    "engine",
    "forest",
    "garden",
    "harbor",
    "island",
    "jungle",
    "kettle",
    "lantern",
    "meadow",
    "needle",
    "orchard",
    "pepper",
    "quarry",
    "river",
    "saddle",
    "timber",
    "umbrella",
    "valley",
    "willow",
    "yarrow",
    "anchor",
    "basket",
    "copper",
    "desert",
    "ember",
    "falcon",
    "glacier",
    "hollow",
    "ivory",
    "jasper",
    "kernel",
    "ledger",
    "marble",
    "nectar",
    "oyster",
    "pebble",
    "quiver",
    "ribbon",
    "summit",
    "thistle",
    "velvet",
    "walnut",
    "zephyr",
]
SEARCH_TERM = "xylophone"


def search_texts(total: int, hits: int) -> list[str]:
    """The ``search`` scenario's messages, the same for every run of one size: 8 words
    each, one in every ``total // hits`` carrying :data:`SEARCH_TERM` (twice in every
    other one, so ranking has something to order)."""
    every = total // hits
    rng = random.Random(total)

    def body(i: int) -> str:
        words = rng.choices(SEARCH_WORDS, k=8)
        if i % every == every - 1:
            words[rng.randrange(8)] = SEARCH_TERM
            if (i // every) % 2:
                words[rng.randrange(8)] = SEARCH_TERM.capitalize()
        return f"message {i}: {' '.join(words)}"

    return [body(i) for i in range(total)]


async def time_searches(
    client: Client,
    user: User,
    room: str,
    repeats: int,
    hook: Hook,
    matches: Callable[[dict[str, Any]], bool],
) -> dict[str, Any]:
    """``POST /search`` for :data:`SEARCH_TERM` in ``room`` (``keys`` ``content.body``),
    ``order_by`` ``rank`` and ``recent`` (the default page of 10), each ``repeats`` times
    after one untimed call (median ms). Checked: 10 results, all of them ``matches``;
    ``recent`` newest first. Also used on a room filled otherwise
    (``bench/search_room.py``)."""
    results: dict[str, Any] = {}
    for order in ("rank", "recent"):
        name = f"search_{order}"
        request = {
            "search_categories": {
                "room_events": {
                    "search_term": SEARCH_TERM,
                    "order_by": order,
                    "keys": ["content.body"],
                    "filter": {"rooms": [room]},
                }
            }
        }

        def query(request: dict[str, Any] = request) -> Awaitable[Any]:
            return client.call("POST", "/search", user.token, request)

        async with hook(name):
            times, answer = await timed_calls(repeats, query)
        found = answer["search_categories"]["room_events"]
        got = [r["result"] for r in found.get("results", [])]
        if len(got) != 10 or not all(matches(e) for e in got):
            raise RuntimeError(f"{name}: {len(got)} results, not 10 with the term")
        if order == "recent":
            stamps = [e["origin_server_ts"] for e in got]
            if stamps != sorted(stamps, reverse=True):
                raise RuntimeError(f"{name}: results not newest first")
        results[f"{name}_ms_first"] = times[0]
        results[f"{name}_ms_p50"] = statistics.median(times)
        results[f"{name}_count"] = found.get("count")
    return results


async def search(client: Client, sizes: dict[str, int], tag: str, hook: Hook) -> dict[str, Any]:
    """A room of M messages of 8 words each (sent concurrently through ``PUT /send``,
    set-up), one in every M/H carrying the term (twice in every other one, so ranking
    has something to order); then ``POST /search`` for the term in that room, ``order_by``
    ``rank`` and ``recent`` (the default page of 10), repeated (median ms). Checked: 10
    results, all of them messages with the term; ``recent`` newest first."""
    total, hits = sizes["search_msgs"], sizes["search_hits"]
    user = await client.register(f"se{tag}")
    room = await client.create_room(user)
    texts = search_texts(total, hits)
    started = time.perf_counter()
    ids = await bounded(SETUP_CONCURRENCY, [client.send(user, room, t) for t in texts])
    setup_s = time.perf_counter() - started
    with_term = {e for e, t in zip(ids, texts, strict=True) if SEARCH_TERM in t.lower()}
    results: dict[str, Any] = {
        "search_room_messages": total,
        "search_matching": len(with_term),
        "search_setup_events_per_s": total / setup_s,
    }
    results.update(
        await time_searches(
            client, user, room, sizes["search_repeats"], hook, lambda e: e["event_id"] in with_term
        )
    )
    return results


RUNNERS: dict[str, Callable[[Client, dict[str, int], str, Hook], Awaitable[dict[str, Any]]]] = {
    "send_seq": send_seq,
    "send_16": send_16,
    "sync_wake": sync_wake,
    "initial_sync": initial_sync,
    "messages": messages,
    "state": state,
    "keys_query": keys_query,
    "keys_claim": keys_claim,
    "to_device_wake": to_device_wake,
    "media": media,
    "profile_fanout": profile_fanout,
    "presence_wake": presence_wake,
    "relations_thread": relations_thread,
    "search": search,
}


# -- profiling -------------------------------------------------------------------------


#: A sample whose innermost frame is one of these is a thread waiting, not working: the
#: event loop in epoll, a pool thread waiting for work (py-spy cannot always tell).
IDLE_FRAMES = ("Selector.select (selectors.py", "_worker (concurrent/futures/thread.py:81)")


def summarize_profile(raw: Path, top: int = 25) -> dict[str, Any]:
    """Where the server's time went, from py-spy's raw output (``frame;...;frame count``
    per stack, outermost first): the share of samples spent idle, and of the busy samples
    the frames with the most self time and the roomstream frames with the most inclusive
    time (percent of busy samples)."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    busy = idle = 0
    for line in raw.read_text(encoding="utf-8", errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        if any(idle_frame in frames[-1] for idle_frame in IDLE_FRAMES):
            idle += count
            continue
        busy += count
        for frame in set(frames):
            if "roomstream/" in frame and "roomstream/cli.py" not in frame:
                inclusive[frame] += count
        own[frames[-1]] += count
    if not busy:
        return {"samples": idle, "idle_pct": 100.0, "self": [], "inclusive": []}

    def pct(n: int) -> float:
        return round(100 * n / busy, 1)

    return {
        "samples": busy + idle,
        "idle_pct": round(100 * idle / (busy + idle), 1),
        "self": [[frame, pct(n)] for frame, n in own.most_common(top)],
        "inclusive": [[frame, pct(n)] for frame, n in inclusive.most_common(top)],
    }


def profiler(pid: int | None, wanted: str | None, out_dir: Path, report: dict[str, Any]) -> Hook:
    """A hook that runs ``py-spy record`` on ``pid`` while scenario ``wanted`` is timed."""

    @contextlib.asynccontextmanager
    async def hook(name: str) -> AsyncIterator[None]:
        if pid is None or name != wanted:
            yield
            return
        raw = out_dir / f"profile_{name}.txt"
        spy = await asyncio.create_subprocess_exec(
            shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy"),
            *("record", "--pid", str(pid), "--rate", "250", "--format", "raw"),
            *("--output", str(raw), "--nonblocking"),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        await asyncio.sleep(1)  # py-spy attaching (outside the timed part that follows)
        try:
            yield
        finally:
            spy.send_signal(signal.SIGINT)
            await spy.wait()
            report[name] = summarize_profile(raw) if raw.exists() else {}

    return hook


# -- servers under test ----------------------------------------------------------------


@dataclass
class Server:
    url: str
    pid: int | None = None
    info: dict[str, Any] = field(default_factory=dict)


async def wait_http(url: str, proc: asyncio.subprocess.Process, limit: float = 180) -> None:
    deadline = time.monotonic() + limit
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if proc.returncode is not None:
                raise RuntimeError(f"server exited with {proc.returncode}")
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with session.get(f"{url}/_matrix/client/versions") as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.2)  # polling a starting server's readiness
    raise RuntimeError(f"{url} did not start in {limit} s")


@contextlib.asynccontextmanager
async def child_process(
    args: list[str], log: Path, cwd: Path | None = None
) -> AsyncIterator[asyncio.subprocess.Process]:
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(*args, stdout=out, stderr=out, cwd=cwd)
        try:
            yield proc
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(proc.wait(), 30)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()


@contextlib.contextmanager
def throwaway_pg_database(prefix: str, synapse_style: bool = False) -> Any:
    """A new empty PostgreSQL database (C collation for Synapse); its DSN; dropped after."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(common.PG_ADMIN_DSN, autocommit=True) as admin:
        query = "CREATE DATABASE {}"
        if synapse_style:
            query += " ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"
        admin.execute(sql.SQL(query).format(sql.Identifier(name)))
    try:
        yield common.PG_ADMIN_DSN.rsplit("/", 1)[0] + "/" + name, name
    finally:
        with psycopg.connect(common.PG_ADMIN_DSN, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@contextlib.asynccontextmanager
async def roomstream(engine: str, work: Path) -> AsyncIterator[Server]:
    port = free_port()
    with contextlib.ExitStack() as stack:
        database: dict[str, Any] = {"engine": "sqlite", "path": str(work / "roomstream.db")}
        if engine == "postgres":
            dsn, _ = stack.enter_context(throwaway_pg_database("roomstream_bench_client"))
            database = {"engine": "postgres", "dsn": dsn}
        config = {
            "server_name": "bench.local",
            "data_dir": str(work / "data"),
            "database": database,
            "instances": {"main": {"http_port": port, "replication_port": free_port()}},
        }
        (work / "roomstream.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
        args = [sys.executable, "-m", "roomstream.cli", "-c", str(work / "roomstream.yaml")]
        async with child_process([*args, "run"], work / "roomstream.log") as proc:
            url = f"http://127.0.0.1:{port}"
            await wait_http(url, proc)
            yield Server(url, proc.pid, {"version": common._package_version("roomstream")})


def synapse_config(
    config: dict[str, Any], port: int, work: Path, pg_db: str | None, presence: bool = False
) -> None:
    """The benchmark deltas of ``shared/peers/synapse/config_patch.py``, on a generated
    config: one plain-HTTP client listener on loopback, open registration with
    ``m.login.dummy``, every ``rc_*`` limiter out of the way, ``bcrypt_rounds: 4``
    (registration is set-up), no trusted key servers (no internet), presence off unless
    ``presence`` (Synapse's own default is on; ``presence_wake`` needs it)."""
    big = {"per_second": 1_000_000, "burst_count": 1_000_000}
    flat = [
        "rc_message",
        "rc_registration",
        "rc_registration_token_validity",
        "rc_admin_redaction",
        "rc_joins_per_room",
        "rc_key_requests",
        "rc_3pid_validation",
        "rc_third_party_invite",
        "rc_media_create",
        "rc_delayed_event_mgmt",
        "rc_room_creation",
        "rc_reports",
        "rc_user_directory",
        "rc_profile",
    ]
    nested = {
        "rc_login": ["address", "account", "failed_attempts"],
        "rc_joins": ["local", "remote"],
        "rc_invites": ["per_room", "per_user", "per_issuer"],
        "rc_presence": ["per_user"],
    }
    config.update({key: dict(big) for key in flat})
    config.update({key: {sub: dict(big) for sub in subs} for key, subs in nested.items()})
    config.update(
        listeners=[
            {
                "port": port,
                "bind_addresses": ["127.0.0.1"],
                "type": "http",
                "tls": False,
                "x_forwarded": False,
                "resources": [{"names": ["client", "media"], "compress": False}],
            }
        ],
        enable_registration=True,
        enable_registration_without_verification=True,
        bcrypt_rounds=4,
        trusted_key_servers=[],
        suppress_key_server_warning=True,
        presence={"enabled": presence},
        report_stats=False,
    )
    if pg_db is not None:
        config["database"] = {
            "name": "psycopg2",
            "args": {
                "user": "postgres",
                "host": "127.0.0.1",
                "database": pg_db,
                "cp_min": 5,
                "cp_max": 10,
            },
        }


def pending_background_updates(database: Path | str) -> int:
    """Synapse's queued background schema updates (a file path: SQLite; else a DSN)."""
    query = "SELECT COUNT(*) FROM background_updates"
    if isinstance(database, Path):
        with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as conn:
            return int(conn.execute(query).fetchone()[0])
    with psycopg.connect(database) as conn:
        row = conn.execute(query).fetchone()
        return int(row[0]) if row else 0


async def wait_background_updates(database: Path | str, limit: float = 900) -> float:
    """Wait until a fresh Synapse has run its background updates; the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        try:
            if await asyncio.to_thread(pending_background_updates, database) == 0:
                return time.monotonic() - started
        except (sqlite3.Error, psycopg.Error):
            pass  # the table is being created or is locked for a moment
        await asyncio.sleep(1)  # polling the server's own progress
    raise RuntimeError(f"synapse background updates still pending after {limit} s")


@contextlib.asynccontextmanager
async def synapse(engine: str, work: Path, presence: bool = False) -> AsyncIterator[Server]:
    port = free_port()
    config_path = work / "homeserver.yaml"
    generate = [
        *(sys.executable, "-m", "synapse.app.homeserver", "--server-name", "bench.local"),
        *("--config-path", str(config_path), "--data-directory", str(work)),
        *("--generate-config", "--report-stats=no"),
    ]
    done = await asyncio.create_subprocess_exec(
        *generate, cwd=work, stdout=asyncio.subprocess.DEVNULL
    )
    if await done.wait() != 0:
        raise RuntimeError("synapse --generate-config failed")
    with contextlib.ExitStack() as stack:
        database: Path | str = work / "homeserver.db"  # the generated config's SQLite file
        pg_db = None
        if engine == "postgres":
            database, pg_db = stack.enter_context(
                throwaway_pg_database("synapse_bench_client", synapse_style=True)
            )
        config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
        synapse_config(config, port, work, pg_db, presence)
        config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
        args = [sys.executable, "-m", "synapse.app.homeserver", "-c", str(config_path)]
        async with child_process(args, work / "synapse.log", cwd=work) as proc:
            url = f"http://127.0.0.1:{port}"
            await wait_http(url, proc)
            waited = await wait_background_updates(database)
            print(f"  (background updates done after {waited:.0f} s)", flush=True)
            yield Server(url, proc.pid, {"version": common._package_version("matrix-synapse")})


def synapse_available(engine: str) -> bool:
    try:
        import synapse  # noqa: F401

        if engine == "postgres":
            import psycopg2  # noqa: F401
    except ImportError:
        return False
    return True


# -- the run ---------------------------------------------------------------------------

#: Label -> starter, given the work directory and whether presence is measured (roomstream
#: tracks presence in every run, its default; Synapse only then, as the benchmark turns it
#: off otherwise).
STARTERS: dict[str, Callable[[Path, bool], contextlib.AbstractAsyncContextManager[Server]]] = {
    "roomstream sqlite": lambda work, presence: roomstream("sqlite", work),
    "roomstream postgres": lambda work, presence: roomstream("postgres", work),
    "synapse sqlite": lambda work, presence: synapse("sqlite", work, presence),
    "synapse postgres": lambda work, presence: synapse("postgres", work, presence),
}


async def measure(
    client: Client, sizes: dict[str, int], hook: Hook, scenarios: list[str]
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name in scenarios:
        load_before = os.getloadavg()[0]
        started = time.perf_counter()
        try:
            figures = await RUNNERS[name](client, sizes, uuid.uuid4().hex[:6], hook)
        except (HTTPError, RuntimeError, aiohttp.ClientError, TimeoutError) as exc:
            # One scenario failing (a server error, a wrong answer) must not hide the
            # others' figures: recorded and reported.
            results[f"{name}_error"] = str(exc)[:500]
            print(f"  {name}: FAILED: {exc}", flush=True)
            continue
        results.update(figures)
        results[f"{name}_load_1min"] = round(load_before, 1)  # other work on the machine
        shown = ", ".join(f"{k} {v:,.1f}" for k, v in figures.items())
        print(
            f"  {name} ({time.perf_counter() - started:.0f} s with set-up, "
            f"load {load_before:.1f}): {shown}",
            flush=True,
        )
    return results


def ratios(targets: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """roomstream over Synapse per headline, same engine where both ran, else Synapse on
    SQLite; above 1 means roomstream is better (faster or sooner)."""
    out: dict[str, dict[str, float]] = {}
    for label, figures in targets.items():
        if not label.startswith("roomstream"):
            continue
        engine = label.split()[-1]
        peer_label = next(
            (p for p in (f"synapse {engine}", "synapse sqlite") if p in targets), None
        )
        if peer_label is None:
            continue
        peer = targets[peer_label]
        these: dict[str, float] = {}
        for headline, (key, higher_better) in HEADLINES.items():
            if key in figures and key in peer and figures[key] and peer[key]:
                these[headline] = (
                    figures[key] / peer[key] if higher_better else peer[key] / figures[key]
                )
        out[f"{label} vs {peer_label}"] = these
    return out


def ratio_verdicts(ratios_found: dict[str, dict[str, float]]) -> dict[str, bool]:
    """Whether roomstream on SQLite reached :data:`RATIO_TARGETS` against Synapse on
    SQLite, for the headlines both measured."""
    pair = ratios_found.get("roomstream sqlite vs synapse sqlite", {})
    return {h: pair[h] >= bound for h, bound in RATIO_TARGETS.items() if h in pair}


def verdicts(figures: dict[str, Any]) -> dict[str, bool]:
    met = {}
    for key, (op, bound) in TARGETS.items():
        if key in figures:
            met[key] = figures[key] >= bound if op == ">=" else figures[key] <= bound
    return met


async def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = dict(SIZES["quick" if args.quick else "full"])
    for override in args.size:
        key, _, value = override.partition("=")
        if key not in sizes or not value.isdigit():
            raise SystemExit(f"--size {override}: expected KEY=N with KEY in {list(sizes)}")
        sizes[key] = int(value)
    scenarios = args.scenario or list(SCENARIOS)
    results: dict[str, Any] = {"sizes": sizes, "scenarios": scenarios, "targets": {}}
    if args.url:
        labels = list(args.url)
    else:
        labels = args.target or [
            t for t in STARTERS if t.startswith("roomstream") or synapse_available(t.split()[1])
        ]
        if args.only:
            labels = [t for t in labels if any(word in t for word in args.only)]
    work_root = Path(tempfile.mkdtemp(prefix="bench_client_"))
    profiles: dict[str, Any] = {}
    try:
        for label in labels:
            print(f"{label}:", flush=True)
            work = work_root / "".join(c if c.isalnum() else "_" for c in label)
            work.mkdir()
            timeout = aiohttp.ClientTimeout(total=600)
            async with contextlib.AsyncExitStack() as stack:
                if args.url:
                    server = Server(label)
                else:
                    starter = STARTERS[label](work, "presence_wake" in scenarios)
                    server = await stack.enter_async_context(starter)
                session = await stack.enter_async_context(
                    aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0))
                )
                pid = server.pid if label.startswith("roomstream") else None
                report: dict[str, Any] = {}
                hook = profiler(pid, args.profile, work_root, report)
                load_before = os.getloadavg()
                measured = await measure(Client(server.url, session), sizes, hook, scenarios)
                measured.update(server.info)
                measured["load_before"] = [round(x, 2) for x in load_before]
                measured["load_after"] = [round(x, 2) for x in os.getloadavg()]
                if label == "roomstream sqlite":
                    measured["targets_met"] = verdicts(measured)
                results["targets"][label] = measured
                if report:
                    profiles[label] = report
    finally:
        if args.keep:
            print(f"work directories kept in {work_root}")
        else:
            shutil.rmtree(work_root, ignore_errors=True)
    results["ratios"] = ratios(results["targets"])
    results["ratio_targets_met"] = ratio_verdicts(results["ratios"])
    if profiles:
        results["profiles"] = profiles
    return results


def print_table(results: dict[str, Any]) -> None:
    """The figures as a Markdown table (one column per server, then the ratios)."""
    targets = results["targets"]
    labels = list(targets)
    pairs = list(results["ratios"])
    header = ["scenario", *labels, *(f"ratio {p.split(' vs ')[0]}" for p in pairs)]
    rows = []
    for headline, (key, higher_better) in HEADLINES.items():
        if not any(key in targets[t] for t in labels):
            continue  # a scenario not run (--scenario): no row of dashes
        unit, digits = ("events/s", 0) if higher_better else ("ms", 1)
        row = [f"{headline} ({unit})"]
        row += [f"{targets[t][key]:,.{digits}f}" if key in targets[t] else "-" for t in labels]
        row += [
            f"{results['ratios'][p][headline]:.1f}x" if headline in results["ratios"][p] else "-"
            for p in pairs
        ]
        rows.append(row)
    print(common.markdown_table(header, rows))
    for pair in pairs:
        print(f"ratios: {pair} (above 1: roomstream better)")
    for headline, met in results.get("ratio_targets_met", {}).items():
        wanted = RATIO_TARGETS[headline]
        print(f"target {headline} >= {wanted:g}x Synapse (SQLite): {'met' if met else 'NOT met'}")
    for label, report in results.get("profiles", {}).items():
        for name, summary in report.items():
            print(
                f"profile of {label}, {name}: {summary.get('samples', 0)} samples, "
                f"{summary.get('idle_pct', 0)}% idle; % of busy samples:"
            )
            for kind in ("self", "inclusive"):
                print(f"  {kind}:")
                for frame, share in summary.get(kind, []):
                    print(f"    {share:5.1f}  {frame}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    parser.add_argument(
        "--target", action="append", choices=list(STARTERS), help="server to start (repeatable)"
    )
    parser.add_argument(
        "--only", action="append", metavar="WORD", help="targets whose name has this word"
    )
    parser.add_argument("--url", action="append", help="drive this running homeserver instead")
    parser.add_argument(
        "--scenario", action="append", choices=SCENARIOS, help="only these (repeatable)"
    )
    parser.add_argument(
        "--profile", choices=TIMED_PARTS, help="sample the roomstream server with py-spy here"
    )
    parser.add_argument(
        "--size",
        action="append",
        default=[],
        metavar="KEY=N",
        help=f"override a size (keys: {', '.join(SIZES['full'])})",
    )
    parser.add_argument("--keep", action="store_true", help="keep server logs and databases")
    parser.add_argument("--show", metavar="JSON", help="print the tables of a results file")
    parser.add_argument("--no-write", action="store_true", help="do not write the JSON file")
    parser.add_argument(
        "--name",
        default="client_api",
        help="results file stem: bench/results/NAME.json (default client_api)",
    )
    args = parser.parse_args()
    if args.show:
        print_table(orjson.loads(Path(args.show).read_bytes())["results"])
        return
    results = asyncio.run(run(args))
    print_table(results)
    if not args.no_write:
        print(f"results: {common.write_results(args.name, results, args.quick)}")


if __name__ == "__main__":
    main()
