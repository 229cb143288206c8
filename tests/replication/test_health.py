"""Health of a real instance whose Redis is unreachable, then reachable.

The instance must not claim "ready" nor ``/health`` "ok" while it cannot replicate; it
says it is degraded (stdout, ``/health`` and a WARNING in the log), and becomes ready by
itself once Redis answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from roomstream.replication.secret import SECRET_FILE, load_or_create_secret
from tests.support.ports import free_port

REDIS = ("127.0.0.1", 6379)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def _proxy(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
    """Forward one connection to the real Redis."""
    redis_reader, redis_writer = await asyncio.open_connection(*REDIS)
    await asyncio.gather(_pipe(client_reader, redis_writer), _pipe(redis_reader, client_writer))


async def _until(check: Callable[[], Awaitable[Any]], limit: float, what: str) -> Any:
    deadline = time.monotonic() + limit
    while True:
        with contextlib.suppress(aiohttp.ClientError, OSError):
            result = await check()
            if result:
                return result
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def _start_run(config: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "ROOMSTREAM_CONFIG"}
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "roomstream.cli", "-c", str(config), "run"],
            cwd=log.parent,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


async def test_unreachable_redis_is_degraded_not_ready(tmp_path: Path, redis_url: str) -> None:
    redis_port, internal_port = free_port(), free_port()
    config = tmp_path / "roomstream.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "server_name": "health.test",
                "instances": {
                    "main": {"replication_port": free_port(), "internal_port": internal_port}
                },
                "replication": {"transport": "redis"},
                "redis": {"host": "127.0.0.1", "port": redis_port},
            }
        )
    )
    log = tmp_path / "main.log"
    proc = _start_run(config, log)
    health_url = f"http://127.0.0.1:{internal_port}/_roomstream/replication/health"
    # The process generates the deployment's secret in its data directory (cwd/data).
    secret = load_or_create_secret(tmp_path / "data" / SECRET_FILE)
    proxy: asyncio.Server | None = None
    try:
        async with aiohttp.ClientSession() as http:

            async def health() -> dict[str, Any]:
                headers = {"Authorization": f"Bearer {secret}"}
                async with http.get(health_url, headers=headers) as resp:
                    assert resp.status == 200
                    body: dict[str, Any] = await resp.json()
                    return body

            def logged(text: str) -> Callable[[], Awaitable[bool]]:
                async def check() -> bool:
                    assert proc.poll() is None, log.read_text()
                    return text in log.read_text()

                return check

            await _until(logged("started, replication degraded"), 60, "the degraded line")
            warning = (
                f"WARNING roomstream.replication.worker: replication degraded: not subscribed to"
                f" redis at 127.0.0.1:{redis_port}"
            )
            await _until(logged(warning), 30, "the WARNING")
            text = log.read_text()
            assert " ready " not in text, text
            doc = await _until(health, 30, "/health")
            assert doc["status"] == "degraded", doc
            assert doc["problems"] == [f"not subscribed to redis at 127.0.0.1:{redis_port}"]

            # Redis comes back: the instance catches on by itself.
            proxy = await asyncio.start_server(_proxy, "127.0.0.1", redis_port)

            async def ok() -> bool:
                return (await health())["status"] == "ok"

            await _until(ok, 60, "/health ok")
            await _until(logged("roomstream instance main ready"), 30, "the ready line")
            assert (await health())["problems"] == []
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            # Off the loop: the Redis proxy runs on this test's loop, and the instance's
            # shutdown talks to Redis through it (a blocking wait starved it).
            await asyncio.to_thread(proc.wait, 30)
        except subprocess.TimeoutExpired:
            proc.kill()
        if proxy is not None:
            proxy.close()
    assert proc.returncode == 0, log.read_text()
