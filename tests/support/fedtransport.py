"""Homeservers with a federation listener in the test's event loop: distinct server names
(``localhost:<port>``), TLS certificates from one test CA, verification on."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from roomstream.config import Config, parse_config
from roomstream.federation.certs import TestCertificateAuthority
from roomstream.federation.listener import RouteInstaller, federation_listener
from roomstream.homeserver import FederationTransport, federation_route_installers, open_room_engine
from roomstream.httpbase import json_response
from roomstream.listener import HttpListener
from roomstream.rooms.engine import RoomEngine
from tests.support.ports import free_port

ECHO_PATH = "/_matrix/federation/v1/test_echo"


@dataclass
class FedServer:
    name: str
    port: int
    config: Config
    engine: RoomEngine
    transport: FederationTransport
    listener: HttpListener


def echo_origin(transport: FederationTransport) -> RouteInstaller:
    """A route answering the authenticated origin (``{"origin": ...}``) of any request."""

    def install(app: web.Application) -> None:
        async def handler(request: web.Request) -> web.Response:
            body = await request.read()
            origin = await transport.authenticate(request, body or None)
            return json_response({"origin": origin})

        app.router.add_route("*", ECHO_PATH + "/{rest:.*}", handler)

    return install


def write_ca(tmp_path: Path, ca: TestCertificateAuthority) -> Path:
    path = tmp_path / "ca.pem"
    path.write_bytes(ca.certificate_pem)
    return path


@asynccontextmanager
async def federation_server(
    tmp_path: Path,
    ca: TestCertificateAuthority,
    *,
    label: str,
    federation: dict[str, Any] | None = None,
    installers: Sequence[Callable[[FederationTransport], RouteInstaller]] = (echo_origin,),
) -> AsyncIterator[FedServer]:
    """One homeserver named ``localhost:<port>`` (SQLite under ``tmp_path/label``) with its
    federation listener on that port, trusting ``ca``; ``federation`` adds config keys."""
    port = free_port()
    home = tmp_path / label
    home.mkdir()
    pair = ca.issue("localhost", "127.0.0.1")
    (home / "tls.crt").write_bytes(pair.certificate_pem)
    (home / "tls.key").write_bytes(pair.private_key_pem)
    config = parse_config(
        {
            "server_name": f"localhost:{port}",
            "data_dir": str(home),
            "instances": {"main": {}},
            "federation": {
                "port": port,
                "tls_certificate_path": str(home / "tls.crt"),
                "tls_private_key_path": str(home / "tls.key"),
                "ca_certificates_path": str(write_ca(tmp_path, ca)),
                "ip_range_blacklist": [],
                **(federation or {}),
            },
        }
    )
    engine = await open_room_engine(config)
    async with AsyncExitStack() as stack:
        stack.push_async_callback(engine.close)
        transport = FederationTransport(config, engine)
        stack.push_async_callback(transport.close)
        listener = federation_listener(
            [
                *federation_route_installers(transport, None),
                *(make(transport) for make in installers),
            ],
            config.federation,
            config.http,
        )
        await listener.start("127.0.0.1", port)
        stack.push_async_callback(listener.close)
        yield FedServer(config.server_name, port, config, engine, transport, listener)
