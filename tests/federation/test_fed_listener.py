"""The process assembly's federation listener: TLS on federation.port, separate from the
client listener, key routes served, unknown paths 404 M_UNRECOGNIZED."""

from __future__ import annotations

import ssl
from pathlib import Path

import aiohttp
from signedjson.sign import verify_signed_json

from roomstream.config import parse_config
from roomstream.federation.certs import TestCertificateAuthority
from roomstream.homeserver import Homeserver, open_room_engine
from roomstream.rooms.keys import parse_verify_key
from tests.support.ports import free_port


async def test_homeserver_serves_federation_over_tls(tmp_path: Path) -> None:
    ca = TestCertificateAuthority()
    pair = ca.issue("localhost")
    (tmp_path / "ca.pem").write_bytes(ca.certificate_pem)
    (tmp_path / "tls.crt").write_bytes(pair.certificate_pem)
    (tmp_path / "tls.key").write_bytes(pair.private_key_pem)
    fed_port, http_port = free_port(), free_port()
    config = parse_config(
        {
            "server_name": "hs.test",
            "data_dir": str(tmp_path / "data"),
            "instances": {
                "main": {
                    "replication_port": free_port(),
                    "http_port": http_port,
                    "internal_port": free_port(),
                }
            },
            "federation": {
                "port": fed_port,
                "tls_certificate_path": str(tmp_path / "tls.crt"),
                "tls_private_key_path": str(tmp_path / "tls.key"),
            },
        }
    )
    engine = await open_room_engine(config)
    server = Homeserver(config, engine)
    try:
        await server.start()
        assert server.federation_http is not None and server.federation_http.port == fed_port
        context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        fed = f"https://localhost:{fed_port}"
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{fed}/_matrix/key/v2/server", ssl=context) as response:
                assert response.status == 200
                assert response.headers["Content-Type"] == "application/json"
                keys = await response.json()
            assert keys["server_name"] == "hs.test"
            ((kid, entry),) = keys["verify_keys"].items()
            verify_signed_json(keys, "hs.test", parse_verify_key("hs.test", kid, entry["key"]))
            body = {"server_keys": {"hs.test": {}}}
            async with http.post(f"{fed}/_matrix/key/v2/query", json=body, ssl=context) as r:
                assert (await r.json())["server_keys"][0]["server_name"] == "hs.test"
            for path in ("/_matrix/federation/v1/nothing", "/_matrix/client/versions"):
                async with http.get(fed + path, ssl=context) as response:
                    assert response.status == 404
                    assert (await response.json())["errcode"] == "M_UNRECOGNIZED"
            # The client listener does not serve federation paths.
            url = f"http://127.0.0.1:{http_port}/_matrix/key/v2/server"
            async with http.get(url) as response:
                assert response.status == 404
            # Plain HTTP on the federation port is no answer.
            try:
                async with http.get(f"http://127.0.0.1:{fed_port}/_matrix/key/v2/server") as r:
                    assert r.status >= 400
            except aiohttp.ClientError:
                pass
    finally:
        await server.stop()
        await engine.close()
