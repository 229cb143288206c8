"""Presence across processes (PostgreSQL, Redis): ``w1`` writes presence; users syncing
on ``reader`` are told to it with ``USER_SYNC`` (and their ``set_presence`` relayed over
the internal API), so a user on ``w2`` sees them online; when the reader is killed with
a user in a long poll, the writer, hearing nothing from it for ``process_expiry``, stops
counting its syncs and the user goes offline after the sync timeout."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.cluster import Client, Cluster, register, run_cluster, urls
from tests.support.wait import wait_for

#: Short timeouts (seconds): idle far beyond the test, so only syncing decides.
PRESENCE = {"idle_timeout": 600, "sync_timeout": 1.5, "process_expiry": 4.0}
NO_PRESENCE = '{"presence":{"not_types":["*"]}}'


@pytest.fixture
async def presence_cluster(
    tmp_path: Path, pg_database: str, redis_url: str
) -> AsyncIterator[Cluster]:
    async with run_cluster(tmp_path, pg_database, {}, {"presence": PRESENCE}) as running:
        yield running


async def _room_mates(session: aiohttp.ClientSession, raw: dict[str, Any]) -> tuple[Client, Client]:
    """alice (on the reader) and bob (on w2), sharing a room."""
    url = urls(raw)
    alice = (await register(session, url["w1"], "alice")).on(url["reader"])
    bob = (await register(session, url["w1"], "bob")).on(url["w2"])
    room = (await alice.ok("POST", "/createRoom", {}))["room_id"]
    await alice.ok("POST", f"/rooms/{room}/invite", {"user_id": bob.user_id})
    await bob.ok("POST", f"/join/{room}", {})
    return alice, bob


def _presence(body: dict[str, Any], user_id: str) -> list[str]:
    return [e["content"]["presence"] for e in body["presence"]["events"] if e["sender"] == user_id]


async def test_users_syncing_on_the_reader_are_online_elsewhere_until_it_dies(
    presence_cluster: Cluster,
) -> None:
    processes, raw = presence_cluster
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession() as session:
        alice, bob = await _room_mates(session, raw)
        # bob watches from w2 (his own syncs leave his presence alone).
        bob_since = (await bob.ok("GET", "/sync?set_presence=offline"))["next_batch"]

        async def alice_is(state: str) -> bool:
            nonlocal bob_since
            body = await bob.ok("GET", f"/sync?since={bob_since}&timeout=500&set_presence=offline")
            bob_since = body["next_batch"]
            return state in _presence(body, alice.user_id)

        # alice long-polls on the reader (presence filtered out of her own answers, so
        # the poll lasts): the reader tells w1 she is syncing.
        # (set_presence=offline: this sync leaves presence alone; only the poll counts.)
        since = (await alice.ok("GET", "/sync?timeout=0&set_presence=offline"))["next_batch"]
        poll = asyncio.create_task(
            alice.call("GET", f"/sync?since={since}&timeout=60000&filter={NO_PRESENCE}")
        )
        try:
            await wait_for(lambda: alice_is("online"), 60, "alice online, seen from w2")
            # While the reader lives, its keepalives keep her syncing: online well past
            # the process expiry and the sync timeout together.
            status = f"/presence/{alice.user_id}/status"
            until = loop.time() + PRESENCE["process_expiry"] + PRESENCE["sync_timeout"] + 1
            while loop.time() < until:
                assert (await bob.ok("GET", status))["presence"] == "online"
                await asyncio.sleep(0.1)  # sampling an invariant, not waiting for an event
            await processes["reader"].kill()
            killed = loop.time()
            await wait_for(lambda: alice_is("offline"), 60, "alice offline after the kill")
            # Not before her sync timed out (counted from when the writer gave the
            # reader up: a process expiry after its last keepalive).
            assert loop.time() - killed >= PRESENCE["sync_timeout"]
        finally:
            poll.cancel()
            with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
                await poll
