"""Discovery through a real ``/.well-known/matrix/server`` over TLS (verification on):
delegation followed, redirects followed hop by hop, and a redirect to a refused address
never connected to."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult
from signedjson.key import generate_signing_key

from roomstream.config import FederationConfig
from roomstream.federation.certs import TestCertificateAuthority
from roomstream.federation.client import FederationClient
from roomstream.federation.discovery import Target
from roomstream.httpbase import json_response
from tests.support.fedtransport import federation_server
from tests.support.ports import free_port


class FixedResolver(AbstractResolver):
    """Test names to loopback addresses (no DNS)."""

    def __init__(self, names: dict[str, str]) -> None:
        self.names = names

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        address = self.names[host]
        return [
            ResolveResult(
                hostname=host,
                host=address,
                port=port,
                family=socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
        ]

    async def close(self) -> None:
        pass


async def test_well_known_delegation_and_redirects(tmp_path: Path) -> None:
    ca = TestCertificateAuthority()
    hits: list[str] = []
    port = free_port()

    async with federation_server(tmp_path, ca, label="b") as b:

        async def well_known(request: web.Request) -> web.StreamResponse:
            hits.append(f"{request.host} {request.path}")
            if request.host.startswith("wk.test"):
                raise web.HTTPFound("/real")  # followed by hand
            # evil.test: a redirect to an address the blacklist refuses
            raise web.HTTPFound(f"https://127.0.0.1:{port}/evil")

        async def real(request: web.Request) -> web.Response:
            hits.append(f"{request.host} {request.path}")
            return json_response({"m.server": b.name}, status=200)

        async def evil(request: web.Request) -> web.Response:
            hits.append("evil")
            return json_response({"m.server": b.name})

        app = web.Application()
        app.router.add_get("/.well-known/matrix/server", well_known)
        app.router.add_get("/real", real)
        app.router.add_get("/evil", evil)
        pair = ca.issue("wk.test", "evil.test", "127.0.0.1")
        (tmp_path / "wk.crt").write_bytes(pair.certificate_pem)
        (tmp_path / "wk.key").write_bytes(pair.private_key_pem)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(tmp_path / "wk.crt", tmp_path / "wk.key")
        runner = web.AppRunner(app)
        await runner.setup()
        for host in ("127.0.0.1", "127.0.0.2"):
            await web.TCPSite(runner, host, port, ssl_context=context).start()
        config = FederationConfig(
            ca_certificates_path=str(tmp_path / "ca.pem"), ip_range_blacklist=("127.0.0.1/32",)
        )
        resolver = FixedResolver(
            {"wk.test": "127.0.0.2", "evil.test": "127.0.0.2", "localhost": "127.0.0.2"}
        )
        client = FederationClient("c.test", generate_signing_key("c"), config, resolver=resolver)
        client.well_known_port = port
        try:
            # B listens on 127.0.0.1 only, which this client refuses: check the target.
            assert await client.discovery.resolve("wk.test") == Target("localhost", b.port, b.name)
            assert hits == [f"wk.test:{port} /.well-known/matrix/server", f"wk.test:{port} /real"]
            # The redirect to 127.0.0.1 is not followed: no well-known, the default.
            assert await client.discovery.resolve("evil.test") == Target(
                "evil.test", 8448, "evil.test"
            )
            assert "evil" not in hits
        finally:
            await client.close()
            await runner.cleanup()
