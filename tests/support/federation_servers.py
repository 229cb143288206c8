"""Real ``roomstream run`` processes federating with each other on loopback.

:class:`FederatedServer` writes one configuration (server name ``localhost:<federation
port>``: no ``.well-known`` or DNS needed; a TLS certificate from the test's CA, which
every server trusts, verification on; ``ip_range_blacklist: []``; a short sender back-off)
and can be started, stopped and started again on the same ports and database, as an
operator restarts a server. :class:`FederatedCluster` is one such server as a deployment
of several processes on PostgreSQL with Redis replication: two events writers, a
federation sender of its own, the federation listener and the client API on ``main``.
:class:`Account` drives the Client-Server API as one user.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

from roomstream.federation.certs import TestCertificateAuthority
from roomstream.storage import DatabaseConfig
from tests.support.homeserver import ServerProcess
from tests.support.ports import free_port


def q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


@dataclass
class Account:
    """One user of one server, through its Client-Server API."""

    server: FederatedServer
    user_id: str
    token: str
    device_id: str = ""
    since: str | None = None

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return await self.server.call(method, path, body, token=self.token)

    async def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, answer = await self.call(method, path, body)
        assert status == 200, (self.user_id, method, path, status, answer)
        return answer

    async def send(self, room_id: str, body: str) -> str:
        self.server.txn += 1
        path = f"/rooms/{q(room_id)}/send/m.room.message/t{self.server.txn}"
        answer = await self.ok("PUT", path, {"msgtype": "m.text", "body": body})
        return str(answer["event_id"])

    async def sync(self, timeout_ms: int = 0) -> Any:
        """An incremental sync from the last one (the first: initial)."""
        path = f"/sync?timeout={timeout_ms}"
        if self.since is not None:
            path += f"&since={q(self.since)}"
        answer = await self.ok("GET", path)
        self.since = answer["next_batch"]
        return answer

    async def messages(self, room_id: str, limit: int = 100) -> list[dict[str, Any]]:
        """The room's timeline as this server serves it, oldest first."""
        answer = await self.ok("GET", f"/rooms/{q(room_id)}/messages?dir=b&limit={limit}")
        return list(reversed(answer["chunk"]))

    async def bodies(self, room_id: str) -> list[str]:
        return [
            e["content"]["body"]
            for e in await self.messages(room_id)
            if e["type"] == "m.room.message"
        ]

    async def state(self, room_id: str) -> dict[tuple[str, str], str]:
        events = await self.ok("GET", f"/rooms/{q(room_id)}/state")
        return {(e["type"], e["state_key"]): e["event_id"] for e in events}


@dataclass
class FederatedServer:
    tmp_path: Path
    label: str
    db_config: DatabaseConfig
    ca: TestCertificateAuthority
    extra: dict[str, Any] = field(default_factory=dict)
    federation_port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    #: The host part of the server name (``127.0.0.1`` for peers that should not resolve
    #: ``localhost``, which may mean ``::1`` first).
    host: str = "localhost"
    process: ServerProcess | None = None
    txn: int = 0
    _session: aiohttp.ClientSession | None = None

    @property
    def server_name(self) -> str:
        return f"{self.host}:{self.federation_port}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def write_config(self) -> Path:
        home = self.tmp_path / self.label
        home.mkdir(parents=True, exist_ok=True)
        pair = self.ca.issue("localhost", "127.0.0.1")
        (home / "tls.crt").write_bytes(pair.certificate_pem)
        (home / "tls.key").write_bytes(pair.private_key_pem)
        (home / "ca.pem").write_bytes(self.ca.certificate_pem)
        database: dict[str, Any] = {"engine": self.db_config.engine}
        if self.db_config.engine == "sqlite":
            database["path"] = str(home / "server.db")
        else:
            database.update(dsn=self.db_config.dsn, schema=self.db_config.schema)
        config: dict[str, Any] = {
            "server_name": self.server_name,
            "data_dir": str(home / "data"),
            "database": database,
            **self.deployment(),
            "federation": {
                "port": self.federation_port,
                "tls_certificate_path": str(home / "tls.crt"),
                "tls_private_key_path": str(home / "tls.key"),
                "ca_certificates_path": str(home / "ca.pem"),
                "ip_range_blacklist": [],
            },
            # Synapse's back-off (10 minutes, doubling) scaled to a test's patience.
            "federation_sender": {"retry_interval_scale": 0.002},
        }
        config.update(self.extra)
        path = home / "roomstream.yaml"
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        return path

    def deployment(self) -> dict[str, Any]:
        """The configuration's processes: one, ``main``."""
        return {
            "instances": {
                "main": {
                    "http_port": self.http_port,
                    "internal_port": free_port(),
                    "replication_port": free_port(),
                }
            }
        }

    async def start(self) -> None:
        path = self.tmp_path / self.label / "roomstream.yaml"
        if not path.exists():
            path = self.write_config()
        self.process = ServerProcess("-m", "roomstream.cli", "-c", str(path), "run", "--no-views")
        await self.process.start()
        if self._session is None:
            self._session = aiohttp.ClientSession()

    async def stop(self) -> None:
        if self.process is not None:
            await self.process.stop()
            errors = self.process.errors()
            assert not errors, "".join(self.process.output[-80:])
            self.process = None

    async def close(self) -> None:
        await self.stop()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def output(self) -> str:
        return "" if self.process is None else "".join(self.process.output[-120:])

    async def call(
        self, method: str, path: str, body: Any = None, *, token: str | None = None
    ) -> tuple[int, Any]:
        assert self._session is not None
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        data = None if body is None else orjson.dumps(body)
        url = f"{self.url}/_matrix/client/v3{path}"
        async with self._session.request(method, url, data=data, headers=headers) as resp:
            return resp.status, orjson.loads(await resp.read())

    async def register(self, name: str) -> Account:
        body = {"username": name, "password": "secret-password", "auth": {"type": "m.login.dummy"}}
        status, answer = await self.call("POST", "/register", body)
        assert status == 200, answer
        return Account(self, answer["user_id"], answer["access_token"], answer["device_id"])


#: The processes of a :class:`FederatedCluster`, in the order they are started.
CLUSTER_INSTANCES = ("w1", "w2", "fed_sender", "main")


@dataclass
class FederatedCluster(FederatedServer):
    """A server as several processes on one PostgreSQL schema (``db_config``'s) with
    Redis replication: ``w1`` and ``w2`` write the events (each room's by the hash of its
    ID), ``fed_sender`` is the federation sender, ``main`` runs the federation listener
    (``federation.instance``), the Client-Server API (:attr:`url`) and writes every other
    stream. ``main`` persists no event itself: what it receives is carried out by the
    rooms' writers."""

    processes: dict[str, ServerProcess] = field(default_factory=dict)

    def deployment(self) -> dict[str, Any]:
        def worker() -> dict[str, int]:
            return {
                "http_port": free_port(),
                "internal_port": free_port(),
                "replication_port": free_port(),
            }

        return {
            "instances": {
                "main": {"http_port": self.http_port, "internal_port": free_port()},
                "w1": worker(),
                "w2": worker(),
                "fed_sender": {"internal_port": free_port()},
            },
            "stream_writers": {"events": ["w1", "w2"]},
            "federation_sender_instances": ["fed_sender"],
            "replication": {"transport": "redis"},
        }

    def config_path(self) -> Path:
        path = self.tmp_path / self.label / "roomstream.yaml"
        return path if path.exists() else self.write_config()

    async def start(self) -> None:
        path = self.config_path()
        for name in CLUSTER_INSTANCES:
            process = ServerProcess(
                "-m", "roomstream.cli", "-c", str(path), "run", "--no-views", "--instance", name
            )
            self.processes[name] = process
            await process.start()
        self.process = self.processes["main"]
        if self._session is None:
            self._session = aiohttp.ClientSession()

    async def stop(self) -> None:
        for process in reversed(list(self.processes.values())):
            await process.stop()
        failed = {name: p.errors() for name, p in self.processes.items() if p.errors()}
        details = self.output()
        self.processes = {}
        self.process = None
        assert not failed, details

    def output(self) -> str:
        return "\n".join(
            f"-- {name}\n" + "".join(p.output[-60:]) for name, p in self.processes.items()
        )
