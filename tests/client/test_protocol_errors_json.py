"""Requests aiohttp's HTTP parser refuses (an over-long request line or header, raw
non-ASCII bytes in the path or a header name) are answered with Matrix JSON, like every
other error, by a real ``roomstream run`` process on its client port (both engines)."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import orjson

from tests.support.homeserver import RunningServer

VERSIONS = b"/_matrix/client/versions"
REFUSED = {
    "long request line": (
        b"GET " + VERSIONS + b"?x=" + b"a" * 9000 + b" HTTP/1.1\r\nHost: a\r\n\r\n",
        "M_TOO_LARGE",
    ),
    "long header": (
        b"GET " + VERSIONS + b" HTTP/1.1\r\nHost: a\r\nX-Long: " + b"b" * 9000 + b"\r\n\r\n",
        "M_TOO_LARGE",
    ),
    "non-ASCII path": (
        b"GET /_matrix/client/v3/rooms/\xc3\xa9\xff/state HTTP/1.1\r\nHost: a\r\n\r\n",
        "M_UNRECOGNIZED",
    ),
    "non-ASCII header name": (
        b"GET " + VERSIONS + b" HTTP/1.1\r\nHost: a\r\nX-\xc3\xa9: 1\r\n\r\n",
        "M_UNRECOGNIZED",
    ),
    "control byte in a header value": (
        b"GET " + VERSIONS + b" HTTP/1.1\r\nHost: a\r\nX-A: \xc3\xa9\x01\r\n\r\n",
        "M_UNRECOGNIZED",
    ),
    "not HTTP": (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", "M_UNRECOGNIZED"),
}


async def exchange(server: RunningServer, payload: bytes) -> tuple[bytes, dict[str, str], bytes]:
    """(status line, headers, body) of the answer to ``payload`` on a fresh connection."""
    address = urlsplit(server.url)
    assert address.hostname is not None and address.port is not None
    reader, writer = await asyncio.open_connection(address.hostname, address.port)
    try:
        writer.write(payload)
        await writer.drain()
        # The server closes the connection after answering (Connection: close otherwise).
        answer = await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status_line.encode(), headers, body


async def test_parser_refusals_are_matrix_json(running_server: RunningServer) -> None:
    for case, (payload, errcode) in REFUSED.items():
        status_line, headers, body = await exchange(running_server, payload)
        assert status_line.split()[1] == b"400", (case, status_line, body[:200])
        assert headers["content-type"].split(";")[0] == "application/json", (case, headers)
        error = orjson.loads(body)
        assert error["errcode"] == errcode and isinstance(error["error"], str), (case, error)


async def test_non_ascii_header_values_are_served(running_server: RunningServer) -> None:
    """aiohttp accepts non-ASCII bytes (obs-text) in a header value: the request is
    served as usual."""
    payload = (
        b"GET " + VERSIONS + b" HTTP/1.1\r\nHost: a\r\nX-A: \xc3\xa9\r\nConnection: close\r\n\r\n"
    )
    status_line, headers, body = await exchange(running_server, payload)
    assert status_line.split()[1] == b"200", (status_line, body[:200])
    assert headers["content-type"].split(";")[0] == "application/json"
    assert "versions" in orjson.loads(body)
