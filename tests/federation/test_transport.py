"""Two homeservers on loopback talking over TLS (verification on, against a test CA):
keys fetched both ways, signed requests accepted and bad ones refused, key rotation,
received events verified with fetched keys, the notary, the ip_range_blacklist."""

from __future__ import annotations

import ssl
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from signedjson.key import generate_signing_key

from roomstream.config import FederationConfig
from roomstream.errors import (
    EventSignatureError,
    FederationDestinationRefusedError,
    FederationRequestError,
)
from roomstream.events.format import build_event_dict, finalise_local_event
from roomstream.events.room_versions import room_version
from roomstream.events.signing import SigningKey, key_id
from roomstream.federation import xmatrix
from roomstream.federation.certs import TestCertificateAuthority
from roomstream.federation.client import FederationClient
from roomstream.federation.keyring import Keyring
from roomstream.rooms.keys import KeyNeed, ServerKeyStore
from roomstream.storage import Database
from tests.support.fedtransport import ECHO_PATH, FedServer, federation_server
from tests.support.rooms import verify_key_base64

V12 = room_version("12")


@pytest.fixture(scope="module")
def ca() -> TestCertificateAuthority:
    return TestCertificateAuthority()


def _now_ms() -> int:
    return int(time.time() * 1000)


def _signing_key(server: FedServer) -> SigningKey:
    key: SigningKey = server.engine.creator.signing_key
    return key


def _create_event(server_name: str, key: SigningKey, ts: int, nonce: str) -> bytes:
    """A v12 room's create event by ``@bob:<server_name>``, signed with ``key``."""
    data = build_event_dict(
        V12,
        event_type="m.room.create",
        sender=f"@bob:{server_name}",
        content={"room_version": "12", "nonce": nonce},
        prev_events=[],
        auth_events=[],
        depth=1,
        state_key="",
        room_id=None,
        origin_server_ts=ts,
    )
    return finalise_local_event(data, V12, server_name, key).raw


async def test_servers_fetch_each_others_keys(tmp_path: Path, ca: TestCertificateAuthority) -> None:
    async with (
        federation_server(tmp_path, ca, label="a") as a,
        federation_server(tmp_path, ca, label="b") as b,
    ):
        for me, other in ((a, b), (b, a)):
            other_kid = key_id(_signing_key(other))
            await me.transport.keyring.fetch([KeyNeed(other.name, other_kid, _now_ms())])
            known = (await me.engine.keys.valid_keys([other.name]))[other.name]
            key, valid_until = known[other_kid]
            assert key.encode() == _signing_key(other).verify_key.encode()
            # An hour ahead (the default key_validity_period), as the server said.
            assert valid_until is not None
            assert 3500_000 < valid_until - _now_ms() <= 3600_000
        answer = await a.transport.client.request("GET", b.name, "/_matrix/key/v2/server")
        assert answer["server_name"] == b.name
        assert key_id(_signing_key(b)) in answer["signatures"][b.name]


async def test_signed_requests_accepted(tmp_path: Path, ca: TestCertificateAuthority) -> None:
    async with (
        federation_server(tmp_path, ca, label="a") as a,
        federation_server(tmp_path, ca, label="b") as b,
    ):
        client = a.transport.client
        # A body, a query string and characters the path must encode: the signature
        # covers exactly what was sent.
        answer = await client.request(
            "PUT",
            b.name,
            ECHO_PATH + "/!room:x/$ev#1 é",
            query={"v": ["1", "2 3"], "alias": "#a:b"},
            content={"pdus": [{"x": "é"}], "n": 1},
        )
        assert answer == {"origin": a.name}
        assert await client.request("GET", b.name, ECHO_PATH + "/q") == {"origin": a.name}
        # And the other way.
        reply = await b.transport.client.request("POST", a.name, ECHO_PATH + "/z", content={})
        assert reply == {"origin": b.name}
        # A path nobody installed: 404 M_UNRECOGNIZED, as a FederationRequestError.
        with pytest.raises(FederationRequestError) as info:
            await client.request("GET", b.name, "/_matrix/federation/v1/nothing_here")
        assert (info.value.status, info.value.errcode) == (404, "M_UNRECOGNIZED")


async def test_bad_authorizations_are_refused(tmp_path: Path, ca: TestCertificateAuthority) -> None:
    async with (
        federation_server(tmp_path, ca, label="a") as a,
        federation_server(tmp_path, ca, label="b") as b,
    ):
        key = _signing_key(a)
        uri = ECHO_PATH + "/x"
        content = {"a": 1}

        def header(**overrides: Any) -> str:
            args: dict[str, Any] = {
                "method": "PUT",
                "uri": uri,
                "origin": a.name,
                "destination": b.name,
                "content": content,
                "signing_key": key,
            }
            args.update(overrides)
            auth = xmatrix.sign_request(**args)
            return xmatrix.authorization_header(auth)

        unknown_key = generate_signing_key("nope")
        cases = {
            "good": header(),
            "no header": None,
            "malformed": f'X-Matrix origin="{a.name}",key="{key_id(key)}"',
            "other content signed": header(content={"a": 2}),
            "other path signed": header(uri=uri + "y"),
            "wrong destination": header(destination="elsewhere.example"),
            "unknown key": header(signing_key=unknown_key),
            "not the origin's key": header(origin=b.name),
        }
        context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        results = {}
        async with aiohttp.ClientSession() as session:
            for name, value in cases.items():
                headers = {"Authorization": value} if value is not None else {}
                async with session.put(
                    f"https://localhost:{b.port}{uri}", json=content, headers=headers, ssl=context
                ) as response:
                    results[name] = (response.status, await response.json())
        assert results.pop("good") == (200, {"origin": a.name})
        for name, (status, body) in results.items():
            assert (status, body["errcode"]) == (401, "M_UNAUTHORIZED"), name


async def test_key_rotation_old_key_verifies_old_events(
    tmp_path: Path, ca: TestCertificateAuthority
) -> None:
    old_key = generate_signing_key("old")
    expired_ts = _now_ms() - 60_000
    old = {key_id(old_key): {"key": verify_key_base64(old_key), "expired_ts": expired_ts}}
    async with (
        federation_server(tmp_path, ca, label="a", federation={"old_signing_keys": old}) as a,
        federation_server(tmp_path, ca, label="b") as b,
    ):
        before = _create_event(a.name, old_key, expired_ts - 1000, "before")
        after = _create_event(a.name, old_key, expired_ts + 1000, "after")
        current = _create_event(a.name, _signing_key(a), _now_ms(), "current")
        # B knows none of A's keys: receive_pdus fetches them from A.
        assert await b.engine.keys.valid_keys([a.name]) == {}
        (stored,) = await b.engine.receive_pdus([before])
        assert stored.new
        (stored,) = await b.engine.receive_pdus([current])
        assert stored.new
        known = (await b.engine.keys.valid_keys([a.name]))[a.name]
        assert known[key_id(old_key)][1] == expired_ts
        with pytest.raises(EventSignatureError, match=r"not signed by .* with a known key"):
            await b.engine.receive_pdus([after])
        # A forged event (signed by a key A never had) is refused too.
        forged = _create_event(a.name, generate_signing_key("x"), _now_ms(), "forged")
        with pytest.raises(EventSignatureError):
            await b.engine.receive_pdus([forged])


async def test_notary(tmp_path: Path, ca: TestCertificateAuthority, database: Database) -> None:
    async with (
        federation_server(tmp_path, ca, label="a") as a,
        federation_server(tmp_path, ca, label="b") as b,
    ):
        a_kid = key_id(_signing_key(a))
        # B answers for A's keys, signed by A and by B.
        answer = await a.transport.client.request("GET", b.name, f"/_matrix/key/v2/query/{a.name}")
        (doc,) = answer["server_keys"]
        assert doc["server_name"] == a.name
        assert set(doc["signatures"]) == {a.name, b.name}
        # A third party that cannot reach A asks B, trusting B's key.
        b_kid = key_id(_signing_key(b))
        direct = a.transport.client.request

        async def request(method: str, destination: str, path: str, **kw: Any) -> Any:
            if destination == a.name:
                raise FederationDestinationRefusedError(destination, "unreachable in this test")
            return await direct(method, destination, path, **kw)

        from roomstream.config import TrustedKeyServer

        store = ServerKeyStore(database)
        third = Keyring(
            store,
            "third.test",
            generate_signing_key("t"),
            request,
            trusted_key_servers=[
                TrustedKeyServer(b.name, {b_kid: verify_key_base64(_signing_key(b))})
            ],
        )
        await third.fetch([KeyNeed(a.name, a_kid, _now_ms())])
        known = (await store.valid_keys([a.name]))[a.name]
        assert known[a_kid][0].encode() == _signing_key(a).verify_key.encode()
        # A notary whose key is not the configured one is not believed.
        other_store = ServerKeyStore(database)
        wrong = Keyring(
            other_store,
            "third.test",
            generate_signing_key("t"),
            request,
            trusted_key_servers=[
                TrustedKeyServer(b.name, {b_kid: verify_key_base64(generate_signing_key("w"))})
            ],
        )
        await database.run_interaction(
            "forget", lambda txn: txn.execute("DELETE FROM server_verify_keys")
        )
        await wrong.fetch([KeyNeed(a.name, a_kid, _now_ms())])
        assert await other_store.valid_keys([a.name]) == {}


async def test_ip_range_blacklist(tmp_path: Path, ca: TestCertificateAuthority) -> None:
    async with federation_server(tmp_path, ca, label="a") as a:
        default = FederationConfig(ca_certificates_path=str(tmp_path / "ca.pem"))
        client = FederationClient("c.test", generate_signing_key("c"), default)
        try:
            for destination in (a.name, f"127.0.0.1:{a.port}"):
                with pytest.raises(FederationDestinationRefusedError):
                    await client.request("GET", destination, "/_matrix/key/v2/server")
        finally:
            await client.close()
        allowed = FederationConfig(
            ca_certificates_path=str(tmp_path / "ca.pem"), ip_range_blacklist=()
        )
        client = FederationClient("c.test", generate_signing_key("c"), allowed)
        try:
            for destination in (a.name, f"127.0.0.1:{a.port}"):
                answer = await client.request("GET", destination, "/_matrix/key/v2/server")
                assert answer["server_name"] == a.name
        finally:
            await client.close()


async def test_certificates_are_verified(tmp_path: Path, ca: TestCertificateAuthority) -> None:
    """A server whose certificate no trusted CA signed is unreachable (verification on)."""
    from roomstream.errors import FederationUnreachableError

    async with federation_server(tmp_path, ca, label="a") as a:
        other_ca = tmp_path / "other-ca.pem"
        other_ca.write_bytes(TestCertificateAuthority("another CA").certificate_pem)
        config = FederationConfig(ca_certificates_path=str(other_ca), ip_range_blacklist=())
        client = FederationClient("c.test", generate_signing_key("c"), config)
        try:
            with pytest.raises(FederationUnreachableError):
                await client.request("GET", a.name, "/_matrix/key/v2/server")
        finally:
            await client.close()


async def test_per_origin_rate_limit(tmp_path: Path, ca: TestCertificateAuthority) -> None:
    limit = {"rate_limit_burst": 2, "rate_limit_per_second": 0.001}
    async with (
        federation_server(tmp_path, ca, label="a") as a,
        federation_server(tmp_path, ca, label="b", federation=limit) as b,
    ):
        for _ in range(2):
            assert await a.transport.client.request("GET", b.name, ECHO_PATH + "/r")
        with pytest.raises(FederationRequestError) as info:
            await a.transport.client.request("GET", b.name, ECHO_PATH + "/r")
        assert (info.value.status, info.value.errcode) == (429, "M_LIMIT_EXCEEDED")
        # The key routes are not authenticated, so not limited.
        assert await a.transport.client.request("GET", b.name, "/_matrix/key/v2/server")
