"""Synapse (from PyPI, the ``dev`` extra) as a federation peer on loopback.

:func:`synapse_peer` generates a configuration, changes what a test peer needs, starts
``synapse.app.homeserver`` and yields once its client API answers:

- server name ``127.0.0.1:<federation port>``: an IP literal with an explicit port, so
  both sides find each other without ``.well-known`` or DNS (the spec's first two
  discovery steps);
- a TLS federation listener (``federation`` and ``keys`` resources) with the certificate
  the test gives, and a plain-HTTP client listener;
- ``federation_verify_certificates: false`` (it cannot know the test's CA) and
  ``ip_range_blacklist: []`` (loopback peers are what it talks to);
- open registration with ``m.login.dummy``, rate limiters out of the way (the tests
  register users and send in bursts), no trusted key servers (no internet), presence on.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

from tests.support.ports import free_port
from tests.support.wait import wait_for

_BIG = {"per_second": 1_000_000, "burst_count": 1_000_000}
_RATE_LIMITS_FLAT = (
    "rc_message",
    "rc_registration",
    "rc_joins_per_room",
    "rc_key_requests",
    "rc_room_creation",
    "rc_federation",
)
_RATE_LIMITS_NESTED = {
    "rc_login": ("address", "account", "failed_attempts"),
    "rc_joins": ("local", "remote"),
    "rc_invites": ("per_room", "per_user", "per_issuer"),
}


@dataclass
class SynapsePeer:
    server_name: str
    client_url: str
    federation_port: int
    log: Path
    process: asyncio.subprocess.Process

    async def call(
        self, method: str, path: str, body: Any = None, *, token: str | None = None
    ) -> tuple[int, Any]:
        """(status, decoded JSON) of a Client-Server API request (path after /v3)."""
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        data = None if body is None else orjson.dumps(body)
        async with (
            aiohttp.ClientSession() as session,
            session.request(
                method, f"{self.client_url}/_matrix/client/v3{path}", data=data, headers=headers
            ) as resp,
        ):
            return resp.status, orjson.loads(await resp.read())

    async def ok(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        status, answer = await self.call(method, path, body, **kw)
        assert status == 200, (method, path, status, answer)
        return answer

    async def register(self, name: str) -> tuple[str, str]:
        """(user ID, access token) of a new user."""
        body = {"username": name, "password": "secret-password", "auth": {"type": "m.login.dummy"}}
        answer = await self.ok("POST", "/register", body)
        return answer["user_id"], answer["access_token"]

    def log_tail(self, lines: int = 60) -> str:
        with contextlib.suppress(OSError):
            return "".join(self.log.read_text(errors="replace").splitlines(True)[-lines:])
        return ""


def peer_config(
    config: dict[str, Any], client_port: int, federation_port: int, cert: Path, key: Path
) -> None:
    """The test peer's changes to a generated configuration (see the module docstring)."""
    config.update({name: dict(_BIG) for name in _RATE_LIMITS_FLAT})
    config.update(
        {name: {sub: dict(_BIG) for sub in subs} for name, subs in _RATE_LIMITS_NESTED.items()}
    )
    config["rc_federation"] = {
        "window_size": 1000,
        "sleep_limit": 1000,
        "sleep_delay": 1,
        "reject_limit": 1000,
        "concurrent": 100,
    }
    config.update(
        listeners=[
            {
                "port": client_port,
                "bind_addresses": ["127.0.0.1"],
                "type": "http",
                "tls": False,
                "resources": [{"names": ["client"], "compress": False}],
            },
            {
                "port": federation_port,
                "bind_addresses": ["127.0.0.1"],
                "type": "http",
                "tls": True,
                "resources": [{"names": ["federation", "keys"], "compress": False}],
            },
        ],
        tls_certificate_path=str(cert),
        tls_private_key_path=str(key),
        federation_verify_certificates=False,
        ip_range_blacklist=[],
        enable_registration=True,
        enable_registration_without_verification=True,
        bcrypt_rounds=4,
        trusted_key_servers=[],
        suppress_key_server_warning=True,
        report_stats=False,
        presence={"enabled": True},
    )


def _make_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)


@contextlib.asynccontextmanager
async def synapse_peer(work: Path, cert: Path, key: Path) -> AsyncIterator[SynapsePeer]:
    """A running Synapse whose federation listener serves ``cert`` / ``key`` (a
    certificate for ``127.0.0.1``); stopped on exit."""
    _make_dir(work)
    client_port, federation_port = free_port(), free_port()
    server_name = f"127.0.0.1:{federation_port}"
    config_path = work / "homeserver.yaml"
    generate = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "synapse.app.homeserver", "--server-name", server_name),
        *("--config-path", str(config_path), "--data-directory", str(work)),
        *("--generate-config", "--report-stats=no"),
        cwd=work,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await generate.communicate()
    assert generate.returncode == 0, f"synapse --generate-config failed: {err.decode()}"
    config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    peer_config(config, client_port, federation_port, cert, key)
    config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
    log = work / "synapse.out"
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "synapse.app.homeserver", "-c", str(config_path)),
            cwd=work,
            stdout=out,
            stderr=out,
        )
    peer = SynapsePeer(
        server_name, f"http://127.0.0.1:{client_port}", federation_port, log, process
    )
    try:

        async def answers() -> bool:
            assert process.returncode is None, "synapse exited:\n" + peer.log_tail()
            status, _ = await peer.call("GET", "/../versions")
            return status == 200

        await wait_for(
            answers,
            180,
            "synapse to answer",
            ignoring=(aiohttp.ClientError, OSError),
            details=peer.log_tail,
        )
        yield peer
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 30)
            except TimeoutError:
                process.kill()
                await process.wait()
