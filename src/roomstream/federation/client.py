"""Outbound federation requests: :class:`FederationClient`, on aiohttp.

Every request is signed (``Authorization: X-Matrix``, :mod:`.xmatrix`) over exactly the
path and query sent; the destination is found by server discovery (:mod:`.discovery`);
TLS certificates are verified (against the system's CAs plus
``federation.ca_certificates_path``) unless ``federation.verify_certificates`` is off.

``ip_range_blacklist``: no connection is ever made to an address in it (Synapse's
default list: loopback, private, link-local, ... and always ``0.0.0.0`` and ``::``). A
DNS name is checked on the addresses it resolves to, inside the connector (the
:class:`BlacklistingResolver` drops refused addresses, so a name resolving to both
kinds reaches only the allowed ones); an IP literal, which aiohttp never hands to a
resolver, is checked before the request. IPv4-mapped and 6to4 IPv6 addresses are
checked as the IPv4 address they carry. Refusal is
:class:`~roomstream.errors.FederationDestinationRefusedError`; nothing is sent.

Errors: an error answer is :class:`~roomstream.errors.FederationRequestError` (its
status and errcode); no answer (discovery, connection, TLS, timeout, an answer that is
not JSON) is :class:`~roomstream.errors.FederationUnreachableError`. Retries: a ``GET``
(safe to repeat) is tried once more after a connection failure; nothing else is retried
here (the federation sender retries transactions, which are idempotent by ``txnId``).
Redirects are not followed (a federation endpoint does not redirect), except for the
well-known lookup.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import ssl
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
import orjson
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver
from yarl import URL

from roomstream.config import FederationConfig
from roomstream.errors import (
    Codes,
    FederationDestinationRefusedError,
    FederationRequestError,
    FederationUnreachableError,
)
from roomstream.events.signing import SigningKey
from roomstream.federation import xmatrix
from roomstream.federation.discovery import (
    MAX_WELL_KNOWN_BYTES,
    ServerDiscovery,
    Target,
    WellKnownAnswer,
)

__all__ = ["BlacklistingResolver", "FederationClient", "IpRangeBlacklist"]

logger = logging.getLogger(__name__)

#: Always refused, whatever the configuration says (as Synapse does).
ALWAYS_REFUSED = ("0.0.0.0/32", "::/128")
#: Characters left as they are in a path (RFC 3986 pchar and "/"; "%" keeps what the
#: caller encoded already).
_PATH_SAFE = "/:@!$&'()*+,;=-._~%"
WELL_KNOWN_TIMEOUT = 10.0
MAX_WELL_KNOWN_REDIRECTS = 5

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class IpRangeBlacklist:
    """The networks outbound requests may not connect to."""

    def __init__(self, ranges: Iterable[str]) -> None:
        self.networks = [ipaddress.ip_network(r, strict=False) for r in (*ranges, *ALWAYS_REFUSED)]

    def refuses(self, address: str) -> bool:
        """Whether ``address`` (an IP, possibly with an IPv6 zone) is refused."""
        try:
            ip: IpAddress = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return True  # not an address at all: never connect to it
        candidates: list[IpAddress] = [ip]
        if isinstance(ip, ipaddress.IPv6Address):
            for carried in (ip.ipv4_mapped, ip.sixtofour):
                if carried is not None:
                    candidates.append(carried)
        return any(
            c in net for c in candidates for net in self.networks if c.version == net.version
        )


class BlacklistingResolver(AbstractResolver):
    """A resolver answering only the addresses the blacklist allows; none allowed is
    :class:`FederationDestinationRefusedError` (not an ``OSError``, so aiohttp passes it
    through to the caller as it is)."""

    def __init__(self, blacklist: IpRangeBlacklist, inner: AbstractResolver | None = None) -> None:
        self.blacklist = blacklist
        self.inner = inner if inner is not None else DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self.inner.resolve(host, port, family)
        allowed = [r for r in results if not self.blacklist.refuses(r["host"])]
        if not allowed:
            raise FederationDestinationRefusedError(
                host, "resolves only to addresses ip_range_blacklist refuses"
            )
        return allowed

    async def close(self) -> None:
        await self.inner.close()


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    return True


def tls_client_context(config: FederationConfig) -> ssl.SSLContext:
    """The TLS context of outbound connections (module doc)."""
    context = ssl.create_default_context()
    if config.ca_certificates_path is not None:
        context.load_verify_locations(cafile=config.ca_certificates_path)
    if not config.verify_certificates:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def encode_path(path: str, query: Mapping[str, str | Sequence[str]] | None) -> str:
    """The request target sent (and signed): ``path`` percent-encoded where it must be,
    then the query string."""
    target = quote(path, safe=_PATH_SAFE)
    if query:
        target += "?" + urlencode(
            [(k, v) for k, vs in query.items() for v in ([vs] if isinstance(vs, str) else vs)],
            quote_via=quote,
        )
    return target


class FederationClient:
    """Signed outbound requests to other homeservers (module doc).

    ``resolver`` replaces DNS resolution under the blacklist (tests); ``discovery``
    replaces the default one (whose well-known fetch goes through this client's
    session)."""

    def __init__(
        self,
        server_name: str,
        signing_key: SigningKey,
        config: FederationConfig,
        *,
        discovery: ServerDiscovery | None = None,
        resolver: AbstractResolver | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.server_name = server_name
        self.signing_key = signing_key
        self.config = config
        self.blacklist = IpRangeBlacklist(config.ip_range_blacklist)
        self.discovery = discovery or ServerDiscovery(self._fetch_well_known, clock)
        self._resolver = resolver
        #: The port well-known lookups go to (443; tests change it).
        self.well_known_port = 443
        self._ssl = tls_client_context(config)
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                ssl=self._ssl,
                resolver=BlacklistingResolver(self.blacklist, self._resolver),
                limit_per_host=32,
            )
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _check_literal(self, destination: str, target: Target) -> None:
        if target.is_ip_literal and self.blacklist.refuses(target.host):
            raise FederationDestinationRefusedError(
                destination, f"{target.host} is in ip_range_blacklist"
            )

    async def _fetch_well_known(self, hostname: str) -> WellKnownAnswer:
        """``https://hostname/.well-known/matrix/server``, following up to
        :data:`MAX_WELL_KNOWN_REDIRECTS` redirects by hand: aiohttp hands the hosts of
        redirects that are IP literals to no resolver, so each hop is checked here."""
        url = URL(f"https://{hostname}:{self.well_known_port}/.well-known/matrix/server")
        try:
            for _hop in range(MAX_WELL_KNOWN_REDIRECTS + 1):
                host = url.host or ""
                if _is_ip(host) and self.blacklist.refuses(host):
                    raise FederationDestinationRefusedError(hostname, f"{host} is refused")
                async with self._http().get(
                    url,
                    timeout=aiohttp.ClientTimeout(total=WELL_KNOWN_TIMEOUT),
                    allow_redirects=False,
                ) as response:
                    location = response.headers.get("Location")
                    if response.status in (301, 302, 303, 307, 308) and location:
                        url = url.join(URL(location))
                        if url.scheme != "https":
                            break
                        continue
                    body = await response.content.read(MAX_WELL_KNOWN_BYTES + 1)
                    return WellKnownAnswer(
                        body if response.status == 200 else None, dict(response.headers)
                    )
        except (aiohttp.ClientError, OSError, TimeoutError, FederationUnreachableError) as exc:
            logger.debug("no well-known for %s: %s", hostname, exc)
        return WellKnownAnswer(None, {})

    async def request(
        self,
        method: str,
        destination: str,
        path: str,
        *,
        query: Mapping[str, str | Sequence[str]] | None = None,
        content: object | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - per request, as the interface says
    ) -> Any:
        """Send one signed request to ``destination``; its decoded JSON answer.

        ``path`` like ``/_matrix/federation/v1/state_ids/!r:x`` (encoded here where it
        must be). Errors as the module docstring says."""
        timeout = self.config.request_timeout if timeout is None else timeout
        try:
            target = await self.discovery.resolve(destination)
        except ValueError as exc:
            raise FederationUnreachableError(destination, str(exc)) from None
        self._check_literal(destination, target)
        uri = encode_path(path, query)
        auth = xmatrix.sign_request(
            method, uri, self.server_name, destination, content, self.signing_key
        )
        headers = {
            "Authorization": xmatrix.authorization_header(auth),
            "Host": target.host_header,
        }
        body = None
        if content is not None:
            body = orjson.dumps(content)
            headers["Content-Type"] = "application/json"
        attempts = 2 if method == "GET" else 1
        for attempt in range(attempts):
            try:
                async with self._http().request(
                    method,
                    URL(target.url(uri), encoded=True),
                    data=body,
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=timeout),
                    allow_redirects=False,
                ) as response:
                    raw = await response.read()
                    status = response.status
                break
            except (aiohttp.ClientConnectionError, OSError) as exc:
                if attempt + 1 < attempts and not isinstance(exc, aiohttp.ServerTimeoutError):
                    continue
                raise FederationUnreachableError(destination, f"{method} {path}: {exc}") from None
            except TimeoutError:
                raise FederationUnreachableError(
                    destination, f"{method} {path}: no answer within {timeout:g} s"
                ) from None
            except aiohttp.ClientError as exc:
                raise FederationUnreachableError(destination, f"{method} {path}: {exc}") from None
        return _decode_answer(destination, method, path, status, raw)

    async def send_transaction(
        self, destination: str, txn_id: str, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        """``PUT /_matrix/federation/v1/send/{txn_id}``; the answer (``{"pdus": ...}``)."""
        answer = await self.request(
            "PUT",
            destination,
            f"/_matrix/federation/v1/send/{quote(txn_id, safe='')}",
            content=dict(body),
        )
        if not isinstance(answer, dict):
            raise FederationUnreachableError(destination, "/send answered with no JSON object")
        return answer


def _decode_answer(destination: str, method: str, path: str, status: int, raw: bytes) -> Any:
    try:
        decoded = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        decoded = None
        if status < 400:
            raise FederationUnreachableError(
                destination, f"{method} {path}: answered {status} with no JSON"
            ) from None
    if status >= 400:
        errcode = decoded.get("errcode") if isinstance(decoded, dict) else None
        error = decoded.get("error") if isinstance(decoded, dict) else None
        raise FederationRequestError(
            destination,
            status,
            errcode if isinstance(errcode, str) else Codes.UNKNOWN,
            f"{method} {path}: {error if isinstance(error, str) else f'HTTP {status}'}",
        )
    return decoded
