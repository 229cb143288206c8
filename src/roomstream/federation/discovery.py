"""Server discovery: where to connect for a server name (Server-Server API, "Resolving
server names").

The decisions are pure functions (:func:`immediate_target`, :func:`delegated_target`,
:func:`default_target`, :func:`parse_well_known`, :func:`well_known_cache_period`);
:class:`ServerDiscovery` puts them together around an injected ``/.well-known`` fetch
and a cache, with the time passed in.

The steps, for ``hostname[:port]``:

1. ``hostname`` is an IP literal: connect to it, on ``port`` or 8448;
2. an explicit ``port``: connect to ``hostname:port``;
3. otherwise ``GET https://hostname/.well-known/matrix/server``; a valid ``m.server``
   of ``delegated[:port]`` is resolved as in 1 and 2 (an IP literal, or an explicit
   port), or else to ``delegated:8448``;
4. no usable well-known: ``hostname:8448``.

In every case the TLS certificate must be valid for the name connected to (the IP for
an IP literal, the hostname or the delegated hostname otherwise), and the ``Host``
header is that name with the port if one was given explicitly. DNS SRV records
(``_matrix-fed._tcp``, and the deprecated ``_matrix._tcp``) are **not** looked up: a
server reachable only through SRV cannot be reached from roomstream; a missing SRV
record changes nothing (it is never asked for).

Caching of the well-known answer: a valid answer for its ``Cache-Control: max-age`` /
``Expires``, clamped to [5 minutes, 48 hours], 24 hours if it says nothing (Synapse's
periods); a failure (unreachable, not 200, not JSON, no valid ``m.server``) for
:data:`FAILURE_CACHE_SECONDS`, so a server without one is not asked on every request
while a transient failure is not remembered for long.
"""

from __future__ import annotations

import ipaddress
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

import orjson

from roomstream.grammar import is_server_name

__all__ = [
    "DEFAULT_PORT",
    "FAILURE_CACHE_SECONDS",
    "ServerDiscovery",
    "Target",
    "WellKnownAnswer",
    "default_target",
    "delegated_target",
    "immediate_target",
    "parse_well_known",
    "split_server_name",
    "well_known_cache_period",
]

DEFAULT_PORT = 8448
DEFAULT_CACHE_SECONDS = 24 * 3600.0
MIN_CACHE_SECONDS = 5 * 60.0
MAX_CACHE_SECONDS = 48 * 3600.0
#: How long a failed well-known lookup is remembered (Synapse's "down" period is 2 min).
FAILURE_CACHE_SECONDS = 120.0
#: Largest well-known body read (Synapse's limit is 50 KiB).
MAX_WELL_KNOWN_BYTES = 50 * 1024


@dataclass(frozen=True)
class Target:
    """Where a server is reached: ``host`` (an IP address without brackets, or a DNS
    name; what the TLS certificate must be valid for) and ``port``, with the ``Host``
    header to send."""

    host: str
    port: int
    host_header: str

    @property
    def is_ip_literal(self) -> bool:
        return _ip(self.host) is not None

    def url(self, path_and_query: str) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"https://{host}:{self.port}{path_and_query}"


@dataclass(frozen=True)
class WellKnownAnswer:
    """What fetching ``/.well-known/matrix/server`` gave: the body of a 200 answer (None
    for anything else, unreachable included) and its caching headers."""

    body: bytes | None
    headers: Mapping[str, str]


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def split_server_name(server_name: str) -> tuple[str, int | None]:
    """``(hostname, port or None)``; an IPv6 literal keeps its brackets. ``ValueError``
    for what is no server name (or has a port out of range)."""
    if not is_server_name(server_name):
        raise ValueError(f"not a server name: {server_name!r}")
    if server_name.startswith("["):
        end = server_name.index("]")
        host, rest = server_name[: end + 1], server_name[end + 1 :]
        if _ip(host) is None or not isinstance(_ip(host), ipaddress.IPv6Address):
            raise ValueError(f"not an IPv6 literal: {host!r}")
        port_text = rest[1:] if rest else None
    else:
        host, sep, port_text_ = server_name.partition(":")
        port_text = port_text_ if sep else None
    if port_text is None:
        return host, None
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise ValueError(f"port out of range in {server_name!r}")
    return host, port


def _unbracket(host: str) -> str:
    return host[1:-1] if host.startswith("[") else host


def immediate_target(server_name: str) -> Target | None:
    """Steps 1 and 2: the target when ``server_name`` decides it alone (an IP literal or
    an explicit port), else None (the well-known must be asked)."""
    host, port = split_server_name(server_name)
    if _ip(host) is None and port is None:
        return None
    return Target(_unbracket(host), port or DEFAULT_PORT, server_name)


def delegated_target(m_server: str) -> Target:
    """Step 3: the target for a well-known's (valid) ``m.server`` value."""
    host, port = split_server_name(m_server)
    return Target(_unbracket(host), port or DEFAULT_PORT, m_server)


def default_target(server_name: str) -> Target:
    """Step 4: no usable well-known: the hostname on 8448."""
    host, _port = split_server_name(server_name)
    return Target(_unbracket(host), DEFAULT_PORT, host)


def parse_well_known(body: bytes) -> str | None:
    """The ``m.server`` of a well-known body, if it is a JSON object with a valid server
    name there; None otherwise."""
    if len(body) > MAX_WELL_KNOWN_BYTES:
        return None
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    m_server = doc.get("m.server") if isinstance(doc, dict) else None
    if not isinstance(m_server, str):
        return None
    try:
        split_server_name(m_server)
    except ValueError:
        return None
    return m_server


_MAX_AGE = re.compile(r"(?:^|,)\s*max-age\s*=\s*\"?(\d+)\"?\s*(?:,|$)", re.IGNORECASE)


def well_known_cache_period(headers: Mapping[str, str], now: float) -> float:
    """Seconds a valid well-known answer is kept: its ``max-age`` (or ``Expires``),
    clamped to [5 min, 48 h]; 24 h when it says neither (or ``no-store``/``no-cache``
    are the only hints, which Synapse treats the same way)."""
    lowered = {k.lower(): v for k, v in headers.items()}
    period: float | None = None
    match = _MAX_AGE.search(lowered.get("cache-control", ""))
    if match is not None:
        period = float(match.group(1))
    elif "expires" in lowered:
        try:
            period = parsedate_to_datetime(lowered["expires"]).timestamp() - now
        except (TypeError, ValueError, IndexError, OverflowError):
            period = None
    if period is None:
        return DEFAULT_CACHE_SECONDS
    return min(max(period, MIN_CACHE_SECONDS), MAX_CACHE_SECONDS)


WellKnownFetch = Callable[[str], Awaitable[WellKnownAnswer]]
"""Fetches ``https://<hostname>/.well-known/matrix/server`` (the hostname given)."""


class ServerDiscovery:
    """Server name -> :class:`Target`, with the well-known answers cached (module doc).

    Invariant: ``fetch_well_known`` is called at most once per hostname per cache
    period, and never for a server name with an IP literal or an explicit port."""

    def __init__(
        self, fetch_well_known: WellKnownFetch, clock: Callable[[], float] = time.time
    ) -> None:
        self._fetch = fetch_well_known
        self._clock = clock
        #: hostname -> (m.server or None for a failure, expiry time)
        self._cache: dict[str, tuple[str | None, float]] = {}

    async def resolve(self, server_name: str) -> Target:
        """Where to reach ``server_name``; ``ValueError`` if it is no server name."""
        target = immediate_target(server_name)
        if target is not None:
            return target
        host, _port = split_server_name(server_name)
        now = self._clock()
        cached = self._cache.get(host)
        if cached is not None and cached[1] > now:
            m_server = cached[0]
        else:
            answer = await self._fetch(host)
            m_server = None if answer.body is None else parse_well_known(answer.body)
            expiry = now + (
                FAILURE_CACHE_SECONDS
                if m_server is None
                else well_known_cache_period(answer.headers, now)
            )
            self._cache[host] = (m_server, expiry)
        return default_target(server_name) if m_server is None else delegated_target(m_server)

    def forget(self, hostname: str) -> None:
        """Drop the cached answer for ``hostname`` (asked again next time)."""
        self._cache.pop(hostname, None)
