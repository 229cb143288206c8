"""``GET /admin/whois/{userId}`` and the client IPs behind it (recorded per device on
authenticated requests, coalesced and written in batches)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from roomstream.accounts.client_ips import LAST_SEEN_GRANULARITY_MS, ClientIps
from roomstream.storage import Database, DatabaseConfig, connect, prepare_database
from tests.support.homeserver import Homeserver


async def test_users_see_their_own_devices_and_admins_anyone(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    await hs.ok("GET", "/account/whoami", token=alice.token, headers={"User-Agent": "probe/1"})
    body = await hs.ok("GET", f"/admin/whois/{alice.user_id}", token=alice.token)
    assert body["user_id"] == alice.user_id
    assert list(body["devices"]) == [alice.device_id]
    [session] = body["devices"][alice.device_id]["sessions"]
    [connection] = session["connections"]
    assert connection["ip"] == "127.0.0.1" and connection["user_agent"] == "probe/1"
    assert isinstance(connection["last_seen"], int) and connection["last_seen"] > 0

    status, error = await hs.call("GET", f"/admin/whois/{alice.user_id}", token=bob.token)
    assert (status, error["errcode"]) == (403, "M_FORBIDDEN")
    admin = await hs.process.accounts.create_account("root", "pw", admin=True, inhibit_login=False)
    assert admin.access_token is not None
    seen_by_admin = await hs.ok("GET", f"/admin/whois/{alice.user_id}", token=admin.access_token)
    assert seen_by_admin["devices"][alice.device_id] == body["devices"][alice.device_id]
    # Written by the batch, read back from the table alike (the pending batch is empty).
    await hs.process.client_ips.flush()
    assert not hs.process.client_ips._pending
    stored = await hs.ok("GET", f"/admin/whois/{alice.user_id}", token=admin.access_token)
    assert stored["devices"][alice.device_id] == body["devices"][alice.device_id]
    # A user who never made a request: no devices (as Synapse, which does not check).
    quiet = await hs.process.accounts.create_account("quiet", "pw")
    assert await hs.ok("GET", f"/admin/whois/{quiet.user_id}", token=admin.access_token) == {
        "user_id": quiet.user_id,
        "devices": {},
    }


async def test_refusals_and_bad_input(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    status, body = await homeserver.call("GET", f"/admin/whois/{alice.user_id}")
    assert (status, body["errcode"]) == (401, "M_MISSING_TOKEN")
    status, body = await homeserver.call("GET", "/admin/whois/alice", token=alice.token)
    assert (status, body["errcode"]) == (400, "M_INVALID_PARAM")
    admin = await homeserver.process.accounts.create_account(
        "root", "pw", admin=True, inhibit_login=False
    )
    status, body = await homeserver.call(
        "GET", "/admin/whois/@someone:elsewhere.example", token=admin.access_token
    )
    assert (status, body["errcode"]) == (400, "M_INVALID_PARAM")
    # A non-admin asking about a remote user is refused for not being an admin first.
    status, body = await homeserver.call(
        "GET", "/admin/whois/@someone:elsewhere.example", token=alice.token
    )
    assert (status, body["errcode"]) == (403, "M_FORBIDDEN")


# -- the recorder against a naive oracle -------------------------------------------------

KEYS = [("@a:x", "D1", "10.0.0.1"), ("@a:x", "D1", "10.0.0.2"), ("@a:x", "D2", "10.0.0.1")]
steps = st.lists(
    st.one_of(
        st.tuples(st.just("request"), st.sampled_from(range(len(KEYS))), st.integers(0, 90_000)),
        st.tuples(st.just("flush"), st.just(0), st.just(0)),
    ),
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(steps=steps)
def test_last_seen_is_never_later_and_at_most_a_granule_behind(
    steps: list[tuple[str, int, int]],
) -> None:
    """Whatever the interleaving of requests (times moving forward) and batch writes,
    each (device, IP) is reported with a ``last_seen`` no later than its latest request
    and less than :data:`LAST_SEEN_GRANULARITY_MS` before it; the user agent reported is
    the one of the request whose time is reported."""
    import tempfile

    async def run() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            db = connect(DatabaseConfig(engine="sqlite", path=str(Path(tmp) / "ips.db")))
            await prepare_database(db)
            now = [1_000_000.0]
            ips = ClientIps(db, clock=lambda: now[0])
            latest: dict[tuple[str, str, str], int] = {}
            agents: dict[tuple[str, str, str], dict[int, str]] = {}
            try:
                for kind, index, advance_ms in steps:
                    if kind == "flush":
                        await ips.flush()
                        continue
                    now[0] += advance_ms / 1000
                    key = KEYS[index]
                    at = int(now[0] * 1000)
                    agent = f"ua{at}"
                    ips.record(*key, agent)
                    latest[key] = at
                    agents.setdefault(key, {})[at] = agent
                for flush_first in (False, True):
                    if flush_first:
                        await ips.flush()
                    devices = await ips.connections("@a:x")
                    reported = {
                        ("@a:x", device, c.ip): c for device, cs in devices.items() for c in cs
                    }
                    assert set(reported) == set(latest)
                    for key, at in latest.items():
                        seen = reported[key].last_seen
                        assert at - LAST_SEEN_GRANULARITY_MS < seen <= at
                        assert reported[key].user_agent == agents[key][seen]
            finally:
                ips.close()
                await db.close()

    asyncio.run(run())


async def test_a_batch_being_written_is_still_served(database: Database) -> None:
    """A read while a batch is in flight (swapped out of the pending batch, not yet
    committed) still reports it; an explicit flush waits for the scheduled one."""
    ips = ClientIps(database)
    ips.record("@a:x", "D1", "10.0.0.1", "ua")
    writing = asyncio.create_task(ips.flush())
    await asyncio.sleep(0)  # let the flush start: the batch is now in flight
    assert not ips._pending and ips._writing
    devices = await ips.connections("@a:x")
    assert [c.ip for c in devices["D1"]] == ["10.0.0.1"]
    ips.record("@a:x", "D2", "10.0.0.2", "ua")
    await ips.flush()  # after the one in flight
    assert writing.done() and not ips._pending and not ips._writing
    stored = await ips.connections("@a:x")
    assert sorted(stored) == ["D1", "D2"]
    ips.close()
