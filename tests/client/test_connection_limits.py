"""What one connection may cost a real ``roomstream run`` process (roomstream.listener).

- Garbage on the client port (random bytes, a request line or a header field of 1 MiB)
  from rounds of 100 connections does not grow the process: its resident memory stays
  within :data:`RSS_BOUND` of what it was before (before the fix, aiohttp kept about
  1.5 MB per such connection until a late cyclic garbage collection, so one round alone
  grew it by about 90 MB and twelve rounds of 200 by 950 MB).
- A request whose headers dribble in one byte at a time is closed after the header
  timeout; one that declares a body and does not send it, after the body timeout; a
  connection with no request in flight, after the idle timeout; a media upload's body
  has the (longer) upload timeout.
- Connections above the per-address cap are closed at once, while the address's other
  connections, other addresses, and a new connection once one has ended are served.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from roomstream.storage import DatabaseConfig
from tests.support.homeserver import SERVER_NAME, ServerProcess
from tests.support.ports import free_port

HEADER_TIMEOUT = 1.0
BODY_TIMEOUT = 1.0
IDLE_TIMEOUT = 1.0
PER_ADDRESS = 4
#: How much a process's resident memory may grow over all the garbage rounds (it grew
#: by about 90 MB per round before the fix; it grows by about 1 MB after it).
RSS_BOUND = 40 * 1024 * 1024
ROUND_CONNECTIONS = 100
ROUNDS = 4
#: Generous limit for the server to close a connection it should close (seconds).
CLOSE_WITHIN = 15.0

VERSIONS = b"GET /_matrix/client/versions HTTP/1.1\r\nHost: test\r\n\r\n"


@dataclass
class Server:
    port: int
    pid: int


@contextlib.asynccontextmanager
async def run_server(
    db_config: DatabaseConfig, tmp_path: Path, per_address: int, idle_timeout: float
) -> AsyncIterator[Server]:
    """``roomstream run`` with short header and body timeouts, ``per_address`` and
    ``idle_timeout``."""
    database: dict[str, Any] = {"engine": db_config.engine}
    if db_config.engine == "sqlite":
        database["path"] = str(tmp_path / "server.db")
    else:
        database.update(dsn=db_config.dsn, schema=db_config.schema)
    http_port = free_port()
    config = {
        "server_name": SERVER_NAME,
        "data_dir": str(tmp_path / "data"),
        "database": database,
        "instances": {"main": {"http_port": http_port, "replication_port": free_port()}},
        "http": {
            "header_timeout": HEADER_TIMEOUT,
            "body_timeout": BODY_TIMEOUT,
            "idle_timeout": idle_timeout,
            "max_connections_per_address": per_address,
        },
    }
    config_path = tmp_path / "roomstream.yaml"
    config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
    process = ServerProcess("-m", "roomstream.cli", "-c", str(config_path), "run")
    await process.start()
    try:
        assert process.process is not None
        yield Server(http_port, process.process.pid)
    finally:
        await process.stop()
    assert not process.errors(), "".join(process.output[-80:])


@pytest.fixture
async def server(db_config: DatabaseConfig, tmp_path: Path) -> AsyncIterator[Server]:
    # A long idle timeout: a close within CLOSE_WITHIN is the header or body timeout's.
    async with run_server(db_config, tmp_path, PER_ADDRESS, 300) as running:
        yield running


@pytest.fixture
async def roomy_server(db_config: DatabaseConfig, tmp_path: Path) -> AsyncIterator[Server]:
    """A cap above one garbage round's connections; a short idle timeout."""
    async with run_server(db_config, tmp_path, 2 * ROUND_CONNECTIONS, IDLE_TIMEOUT) as running:
        yield running


def resident_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


async def connect(
    port: int, source: str = "127.0.0.1"
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))


async def closed_by_server(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection (bounded wait)."""
    received = b""
    while chunk := await asyncio.wait_for(reader.read(65536), CLOSE_WITHIN):
        received += chunk
    return received


async def versions_on(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One keep-alive request on an open connection, answered 200."""
    writer.write(VERSIONS)
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), CLOSE_WITHIN)
    assert head.startswith(b"HTTP/1.1 200"), head
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    body = await asyncio.wait_for(reader.readexactly(length), CLOSE_WITHIN)
    assert b"versions" in body


async def send_garbage(port: int, payload: bytes) -> None:
    reader, writer = await connect(port)
    try:
        writer.write(payload)
        await writer.drain()
    except ConnectionError:
        pass  # the server answered 400 and closed before taking it all
    try:
        answer = await closed_by_server(reader)
    except ConnectionError:
        answer = b""
    finally:
        writer.close()
    # What the server sends back is small: not an echo of the garbage.
    assert len(answer) < 4096, answer[:200]


async def test_garbage_rounds_do_not_grow_the_process(roomy_server: Server) -> None:
    server = roomy_server
    reader, writer = await connect(server.port)
    await versions_on(reader, writer)
    writer.close()
    before = resident_bytes(server.pid)
    mib = 1024 * 1024
    garbage = {
        "random bytes": os.urandom(mib),
        "request line without a line break": b"GET /" + b"a" * mib,
        "a 1 MiB header": b"GET / HTTP/1.1\r\nX-Big: " + b"a" * mib,
    }
    samples: list[tuple[str, int]] = []
    for kind, payload in garbage.items():
        for _ in range(ROUNDS):
            await asyncio.gather(
                *(send_garbage(server.port, payload) for _ in range(ROUND_CONNECTIONS))
            )
            samples.append((kind, resident_bytes(server.pid) - before))
    assert all(grown <= RSS_BOUND for _, grown in samples), samples
    # And it still serves.
    reader, writer = await connect(server.port)
    await versions_on(reader, writer)
    writer.close()


async def test_idle_connections_are_closed(roomy_server: Server) -> None:
    silent = await connect(roomy_server.port)  # never sends a byte
    used = await connect(roomy_server.port)
    await versions_on(*used)  # idle from its answer on
    started = time.monotonic()
    for reader, writer in (silent, used):
        try:
            assert await closed_by_server(reader) == b""
        finally:
            writer.close()
    assert time.monotonic() - started < CLOSE_WITHIN


async def test_headers_dribbled_byte_by_byte_are_cut_off(server: Server) -> None:
    reader, writer = await connect(server.port)
    request = b"GET /_matrix/client/versions HTTP/1.1\r\n" + b"X-Slow: " + b"a" * 4000
    started = time.monotonic()

    async def dribble() -> None:
        for byte in request:
            writer.write(bytes([byte]))
            await writer.drain()
            # Pacing, not synchronisation: a byte every 50 ms keeps the connection busy.
            await asyncio.sleep(0.05)

    dribbler = asyncio.create_task(dribble())
    try:
        await closed_by_server(reader)
    except ConnectionError:
        pass
    finally:
        dribbler.cancel()
        writer.close()
    elapsed = time.monotonic() - started
    # Closed by the header timeout: not before it, and long before the 200 s it would
    # take to send the whole request this way.
    assert HEADER_TIMEOUT * 0.9 <= elapsed < CLOSE_WITHIN
    reader, writer = await connect(server.port)
    await versions_on(reader, writer)
    writer.close()


async def test_a_declared_body_that_never_comes_is_cut_off(server: Server) -> None:
    reader, writer = await connect(server.port)
    started = time.monotonic()
    writer.write(
        b"POST /_matrix/client/v3/login HTTP/1.1\r\nHost: test\r\n"
        b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"type"'
    )
    await writer.drain()
    try:
        answer = await closed_by_server(reader)
    except ConnectionError:
        answer = b""
    finally:
        writer.close()
    assert BODY_TIMEOUT * 0.9 <= time.monotonic() - started < CLOSE_WITHIN
    assert not answer.startswith(b"HTTP/1.1 200"), answer
    reader, writer = await connect(server.port)
    await versions_on(reader, writer)
    writer.close()


async def test_an_upload_may_take_longer_than_the_body_timeout(server: Server) -> None:
    """Media uploads have ``http.upload_timeout`` (300 s by default) for their body."""
    async with aiohttp.ClientSession() as session:
        body = {"username": "slow", "password": "pw-slow-1", "auth": {"type": "m.login.dummy"}}
        url = f"http://127.0.0.1:{server.port}/_matrix/client/v3/register"
        async with session.post(url, json=body) as resp:
            token = (await resp.json())["access_token"]
    reader, writer = await connect(server.port)
    writer.write(
        b"POST /_matrix/media/v3/upload HTTP/1.1\r\nHost: test\r\nContent-Type: text/plain\r\n"
        + f"Authorization: Bearer {token}\r\n".encode()
        + b"Content-Length: 10\r\n\r\nhello"
    )
    await writer.drain()
    # A slow client (what is under test, not synchronisation): the rest of the body
    # comes well after body_timeout.
    await asyncio.sleep(BODY_TIMEOUT * 2.5)
    writer.write(b"world")
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), CLOSE_WITHIN)
    writer.close()
    assert head.startswith(b"HTTP/1.1 200"), head


async def test_connections_above_the_per_address_cap_are_closed(server: Server) -> None:
    held = [await connect(server.port) for _ in range(PER_ADDRESS)]
    try:
        for reader, writer in held:
            await versions_on(reader, writer)  # each one accepted and counted
        reader, writer = await connect(server.port)
        try:
            assert await closed_by_server(reader) == b""
        except ConnectionError:
            pass  # closed by an abort: a reset
        finally:
            writer.close()
        # The address's other connections are served, and so is another address.
        await versions_on(*held[0])
        other = await connect(server.port, source="127.0.0.2")
        await versions_on(*other)
        other[1].close()
        # Once one of the address's connections has ended, a new one is served.
        reader, writer = held.pop()
        writer.write(VERSIONS.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
        await writer.drain()
        assert (await closed_by_server(reader)).startswith(b"HTTP/1.1 200")
        writer.close()
        again = await connect(server.port)
        held.append(again)
        await versions_on(*again)
    finally:
        for _, writer in held:
            writer.close()
