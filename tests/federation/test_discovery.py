"""Server discovery: the spec's decision table, the well-known parsing and caching (time
passed in, the fetch faked)."""

from __future__ import annotations

import pytest

from roomstream.federation.discovery import (
    FAILURE_CACHE_SECONDS,
    ServerDiscovery,
    Target,
    WellKnownAnswer,
    parse_well_known,
    split_server_name,
    well_known_cache_period,
)

#: server name -> its well-known's m.server (None: no usable well-known) -> target.
TABLE = [
    # 1. IP literals: no well-known asked; the IP is what the certificate names.
    ("1.2.3.4", None, Target("1.2.3.4", 8448, "1.2.3.4")),
    ("1.2.3.4:80", None, Target("1.2.3.4", 80, "1.2.3.4:80")),
    ("[::1]", None, Target("::1", 8448, "[::1]")),
    ("[2001:db8::1]:8443", None, Target("2001:db8::1", 8443, "[2001:db8::1]:8443")),
    # 2. explicit port: no well-known asked.
    ("example.org:8449", "ignored.example:1", Target("example.org", 8449, "example.org:8449")),
    # 3. delegation: an IP literal, an explicit port, or the default port.
    ("example.org", "5.6.7.8", Target("5.6.7.8", 8448, "5.6.7.8")),
    ("example.org", "[::2]:99", Target("::2", 99, "[::2]:99")),
    (
        "example.org",
        "matrix.example.org:443",
        Target("matrix.example.org", 443, "matrix.example.org:443"),
    ),
    ("example.org", "matrix.example.org", Target("matrix.example.org", 8448, "matrix.example.org")),
    # 4. no usable well-known: the hostname on 8448.
    ("example.org", None, Target("example.org", 8448, "example.org")),
]


class FakeWellKnown:
    def __init__(self, answers: dict[str, WellKnownAnswer]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    async def __call__(self, hostname: str) -> WellKnownAnswer:
        self.asked.append(hostname)
        return self.answers.get(hostname, WellKnownAnswer(None, {}))


@pytest.mark.parametrize(("server_name", "m_server", "expected"), TABLE)
async def test_discovery_table(server_name: str, m_server: str | None, expected: Target) -> None:
    body = None if m_server is None else f'{{"m.server": "{m_server}"}}'.encode()
    fetch = FakeWellKnown({"example.org": WellKnownAnswer(body, {})})
    assert await ServerDiscovery(fetch, lambda: 0.0).resolve(server_name) == expected
    immediate = split_server_name(server_name)[1] is not None or server_name[0] in "[1"
    assert fetch.asked == ([] if immediate else ["example.org"])


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"m.server": "a.example:1"}', "a.example:1"),
        (b'{"m.server": "a.example:70000"}', None),  # port out of range
        (b'{"m.server": "not a name"}', None),
        (b'{"m.server": 5}', None),
        (b"[]", None),
        (b"not json", None),
        (b'{"m.server": "' + b"a" * 60_000 + b'"}', None),  # too large
    ],
)
def test_parse_well_known(body: bytes, expected: str | None) -> None:
    assert parse_well_known(body) == expected


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({}, 24 * 3600),
        ({"Cache-Control": "max-age=3600"}, 3600),
        ({"cache-control": "public, max-age=10"}, 300),  # clamped up to 5 min
        ({"Cache-Control": "max-age=9999999"}, 48 * 3600),  # clamped down to 48 h
        ({"Expires": "Thu, 01 Jan 1970 02:00:00 GMT"}, 7200),
        ({"Expires": "garbage"}, 24 * 3600),
    ],
)
def test_cache_period(headers: dict[str, str], seconds: float) -> None:
    assert well_known_cache_period(headers, now=0.0) == seconds


async def test_answers_and_failures_are_cached() -> None:
    now = [1000.0]
    fetch = FakeWellKnown(
        {
            "good.example": WellKnownAnswer(
                b'{"m.server": "m.good.example:443"}', {"Cache-Control": "max-age=600"}
            )
        }
    )
    discovery = ServerDiscovery(fetch, lambda: now[0])
    for _ in range(3):
        assert (await discovery.resolve("good.example")).host == "m.good.example"
        assert (await discovery.resolve("bad.example")).host == "bad.example"
    assert fetch.asked == ["good.example", "bad.example"]
    now[0] += FAILURE_CACHE_SECONDS + 1  # the failure is asked again, the answer not
    await discovery.resolve("good.example")
    await discovery.resolve("bad.example")
    assert fetch.asked == ["good.example", "bad.example", "bad.example"]
    now[0] += 600
    await discovery.resolve("good.example")
    assert fetch.asked[-1] == "good.example"


@pytest.mark.parametrize("name", ["", "a b", "a.example:", "a.example:99999", "[::1", "[zz]:1"])
async def test_not_server_names(name: str) -> None:
    with pytest.raises(ValueError):
        await ServerDiscovery(FakeWellKnown({}), lambda: 0.0).resolve(name)
