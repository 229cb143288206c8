"""Requests aiohttp's HTTP parser refuses are answered 400 and leave no traceback in the log.

A bad method on a kept-alive connection made aiohttp log ``Error handling request`` with a
traceback for each such request, so one client sending garbage could flood the log (found
by the fuzz test of the internal API, which asserts no traceback is ever logged).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from roomstream.config import parse_config
from roomstream.listener import quiet_client_protocol_errors
from roomstream.replication.http import InternalHttpServer

GOOD = b"GET /_roomstream/replication/health HTTP/1.1\r\nHost: a\r\n\r\n"
GARBAGE = (
    b"FFO /junk HTTP/1.1\r\nHost: a\r\n\r\n",
    b"A /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc",
    b"GET /x HTTP/1.1\r\nHost: a\r\nBad Header\r\n\r\n",
)


async def _exchange(port: int, payload: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(payload)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 30)  # the server closes after the 400
    finally:
        writer.close()


async def test_garbage_requests_get_400_and_no_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = parse_config({"data_dir": str(tmp_path)})
    server = InternalHttpServer(config)
    port = await server.start(port=0)
    caplog.set_level(logging.DEBUG, logger="aiohttp.server")
    try:
        for garbage in GARBAGE:
            for payload in (garbage, GOOD + garbage):  # first request, and kept alive
                answer = await _exchange(port, payload)
                assert b"400 Bad Request" in answer, answer
    finally:
        await server.close()
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]


def test_the_filter_passes_every_other_record() -> None:
    quiet_client_protocol_errors()
    quiet_client_protocol_errors()  # idempotent
    server_logger = logging.getLogger("aiohttp.server")
    assert len(server_logger.filters) == 1
    record = server_logger.makeRecord(
        "aiohttp.server",
        logging.ERROR,
        __file__,
        1,
        "boom",
        (),
        (RuntimeError, RuntimeError(), None),
    )
    assert server_logger.filters[0].filter(record)  # type: ignore[union-attr]
