"""One-time-key claims under concurrency against a naive oracle, on both engines: rounds of
concurrent ``POST /keys/claim`` (through :class:`~roomstream.e2e.E2eKeys`, each claim its
own transaction) never hand a key out twice, hand out every key before the fallback key,
and then the fallback key (or nothing when there is none)."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roomstream.e2e import E2eKeys
from roomstream.storage import DatabaseConfig, connect, prepare_database
from roomstream.streams import StreamSet

ALGORITHM = "signed_curve25519"
_users = itertools.count()


async def _never_asked(user_id: str, auth: object) -> None:  # pragma: no cover
    raise AssertionError("no password check in claims")


async def run_rounds(
    db_config: DatabaseConfig, uploads: list[int], rounds: list[int], fallback: bool
) -> None:
    database = connect(db_config)
    try:
        await prepare_database(database)
        streams = await StreamSet.open(database, "main", {})
        keys = E2eKeys(database, streams.generator("device_lists"), _never_asked)
        user, device = f"@u{next(_users)}:test", "DEV"  # fresh per example (shared database)
        await database.run_interaction(
            "test_query",
            lambda t: t.execute(
                "INSERT INTO devices (user_id, device_id, created_ts) VALUES (?, ?, 0)",
                (user, device),
            ),
        )
        # The oracle: keys on the server, in upload order; claimed ones gone.
        stored: set[str] = set()
        handed: set[str] = set()
        next_id = 0
        fallback_used = False
        fallback_key = {f"{ALGORITHM}:FB": {"key": "fallback"}} if fallback else None
        for upload, claimers in itertools.zip_longest(uploads, rounds, fillvalue=0):
            new = {
                f"{ALGORITHM}:k{next_id + i:04d}": {"key": str(next_id + i)} for i in range(upload)
            }
            next_id += upload
            counts = await keys.upload(user, device, None, new, fallback_key)
            stored |= set(new)
            assert counts["signed_curve25519"] == len(stored)
            answers = await asyncio.gather(
                *(keys.claim({user: {device: ALGORITHM}}) for _ in range(claimers))
            )
            got = [a["one_time_keys"].get(user, {}).get(device) for a in answers]
            gave_fallback = [g is not None and g == fallback_key for g in got]
            one_time = [
                next(iter(g)) for g, fb in zip(got, gave_fallback, strict=True) if g and not fb
            ]
            # No key twice, in this round or ever; only keys that were stored.
            assert len(one_time) == len(set(one_time))
            assert not set(one_time) & handed and set(one_time) <= stored
            # Every claim gets a one-time key while any is left, then the fallback or none.
            assert len(one_time) == min(claimers, len(stored))
            rest = claimers - len(one_time)
            assert sum(gave_fallback) == (rest if fallback else 0)
            assert sum(1 for g in got if g is None) == (0 if fallback else rest)
            stored -= set(one_time)
            handed |= set(one_time)
            # The fallback key, once handed out, is used (re-uploading it keeps it so).
            fallback_used = fallback_used or (fallback and rest > 0)
            unused = await keys.unused_fallback_key_types(user, device)
            assert unused == ([ALGORITHM] if fallback and not fallback_used else [])
            counts = await keys.one_time_key_counts(user, device)
            assert counts["signed_curve25519"] == len(stored)
    finally:
        await database.close()


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    uploads=st.lists(st.integers(0, 5), min_size=1, max_size=4),
    rounds=st.lists(st.integers(0, 8), min_size=1, max_size=4),
    fallback=st.booleans(),
)
def test_claims_match_the_oracle(
    db_config: DatabaseConfig, tmp_path: Path, uploads: list[int], rounds: list[int], fallback: bool
) -> None:
    asyncio.run(run_rounds(db_config, uploads, rounds, fallback))


async def claim_many_devices(db_config: DatabaseConfig, keys_per_device: list[int]) -> None:
    """Concurrent claims each naming every device (one set-based statement per claim)."""
    database = connect(db_config)
    try:
        await prepare_database(database)
        streams = await StreamSet.open(database, "main", {})
        keys = E2eKeys(database, streams.generator("device_lists"), _never_asked)
        user = f"@m{next(_users)}:test"
        devices = [f"D{i}" for i in range(len(keys_per_device))]

        def add_devices(t: Any) -> None:
            for device in devices:
                t.execute(
                    "INSERT INTO devices (user_id, device_id, created_ts) VALUES (?, ?, 0)",
                    (user, device),
                )

        await database.run_interaction("test_query", add_devices)
        for device, count in zip(devices, keys_per_device, strict=True):
            new = {f"{ALGORITHM}:k{i:04d}": {"key": f"{device}-{i}"} for i in range(count)}
            await keys.upload(user, device, None, new, None)
        claimers = max(keys_per_device) + 1
        wanted = {user: {device: ALGORITHM for device in devices}}
        answers = await asyncio.gather(*(keys.claim(wanted) for _ in range(claimers)))
        for device, count in zip(devices, keys_per_device, strict=True):
            got = [a["one_time_keys"].get(user, {}).get(device) for a in answers]
            handed = [next(iter(g.values()))["key"] for g in got if g]
            # Each key exactly once, to the first `count` claims served (the rest: none).
            assert sorted(handed) == sorted(f"{device}-{i}" for i in range(count))
        counts = [await keys.one_time_key_counts(user, device) for device in devices]
        assert all(c["signed_curve25519"] == 0 for c in counts)
    finally:
        await database.close()


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(keys_per_device=st.lists(st.integers(0, 4), min_size=1, max_size=6))
def test_concurrent_claims_of_many_devices_hand_each_key_out_once(
    db_config: DatabaseConfig, keys_per_device: list[int]
) -> None:
    asyncio.run(claim_many_devices(db_config, keys_per_device))
