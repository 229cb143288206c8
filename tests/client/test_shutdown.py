"""A process told to stop does not wait for its clients' long polls: with a `/sync` long
poll of 60 s in flight, SIGTERM ends `roomstream run` within the listener's short grace
period (aiohttp's default would wait the whole poll out), and the poll gets an answer or
a closed connection, never a hang."""

from __future__ import annotations

import asyncio
import contextlib
import signal

import aiohttp
import pytest

from roomstream.listener import SHUTDOWN_GRACE
from tests.support.homeserver import RunningServer

#: Start-up of the stop, the grace period and the process's own shutdown, with margin for
#: a loaded machine; far below the 60 s poll it must not wait for.
STOP_BOUND = SHUTDOWN_GRACE + 20


@pytest.mark.parametrize("engine_name", ["sqlite"])
async def test_sigterm_does_not_wait_for_long_polls(running_server: RunningServer) -> None:
    url = running_server.url + "/_matrix/client/v3"
    async with aiohttp.ClientSession() as session:
        body = {"username": "poller", "password": "pw", "auth": {"type": "m.login.dummy"}}
        async with session.post(url + "/register", json=body) as resp:
            token = (await resp.json())["access_token"]
        headers = {"Authorization": f"Bearer {token}"}
        async with session.get(url + "/sync", headers=headers) as resp:
            since = (await resp.json())["next_batch"]

        async def long_poll() -> int:
            async with session.get(
                url + "/sync", params={"since": since, "timeout": "60000"}, headers=headers
            ) as resp:
                await resp.read()
                return resp.status

        poll = asyncio.create_task(long_poll())
        # The poll is parked once the server has read it: wait until a second request is
        # answered, which the server handles after the first (one connection each, but
        # requests on one event loop are taken in arrival order).
        async with session.get(url + "/account/whoami", headers=headers) as resp:
            assert resp.status == 200
        assert not poll.done()
        process = running_server.process
        loop = asyncio.get_running_loop()
        started = loop.time()
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), STOP_BOUND)
        assert loop.time() - started < STOP_BOUND
        # The poll ends with the process (an answer or a closed connection), not later.
        with contextlib.suppress(aiohttp.ClientError):
            await asyncio.wait_for(poll, 10)
