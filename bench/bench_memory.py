"""Resident memory of a writer and a reader process under steady client traffic.

A deployment of two processes on PostgreSQL with TCP replication: ``writer`` (writes
every stream) and ``reader`` (writes none; serves the Client-Server API and forwards
writes). ``SENDERS`` users each send messages through the reader into a shared room as
fast as it answers, and as many sync long-polls on the reader follow them; every
``--sample`` seconds the resident memory (``VmRSS``) of both processes is recorded. A
process whose memory is bounded levels off: the last third of the run grows by little.

``--trace DIR`` runs the reader under tracemalloc and dumps a snapshot into ``DIR`` at
each sample (``snapshot-<seconds>.bin``), to compare with
``tracemalloc.Snapshot.load(...).compare_to(...)``.

Usage::

    python bench/bench_memory.py [--quick] [--seconds N] [--cache-size N] [--trace DIR]

``--cache-size N`` sets both caches of served events (``caches`` in the configuration)
to ``N`` entries, so that they fill within the run and what else grows would show.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import yaml
from psycopg import sql

import common

SENDERS = 8
PREFIX = "/_matrix/client/v3"

#: A ``sitecustomize`` for ``--trace``: SIGUSR2 dumps a tracemalloc snapshot.
_TRACE_HOOK = """
import os, signal, time, tracemalloc
tracemalloc.start(12)
def _dump(signum, frame):
    name = "snapshot-%d.bin" % int(time.monotonic())
    tracemalloc.take_snapshot().dump(os.path.join(os.environ["ROOMSTREAM_TRACE_DIR"], name))
signal.signal(signal.SIGUSR2, _dump)
"""


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def resident_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def start(config: Path, name: str, env: dict[str, str]) -> asyncio.subprocess.Process:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "roomstream.cli",
        "-c",
        str(config),
        "run",
        "--instance",
        name,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
    )
    assert process.stdout is not None
    while line := await asyncio.wait_for(process.stdout.readline(), 120):
        if b" ready " in line:
            break
    else:
        raise RuntimeError(f"{name} did not start")

    async def drain() -> None:
        assert process.stdout is not None
        while await process.stdout.readline():
            pass

    asyncio.get_running_loop().create_task(drain())
    return process


class Client:
    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self.session = session
        self.base = base
        self.token = ""

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        async with self.session.request(
            method, self.base + PREFIX + path, json=body, headers=headers
        ) as resp:
            result = await resp.json()
            if resp.status != 200:
                raise RuntimeError(f"{method} {path}: {resp.status} {result}")
            return result

    async def register(self, name: str) -> str:
        body = {"username": name, "password": "pw-" + name, "auth": {"type": "m.login.dummy"}}
        result = await self.call("POST", "/register", body)
        self.token = result["access_token"]
        return str(result["user_id"])


def prepare(args: argparse.Namespace) -> tuple[str, int, Path, dict[str, str], dict[str, str]]:
    """A new schema and a configuration file: (schema, reader port, config, writer's
    environment, reader's environment)."""
    schema = f"bench_memory_{uuid.uuid4().hex[:8]}"
    dsn = common.PG_ADMIN_DSN
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    work = Path(tempfile.mkdtemp(prefix="bench-memory-"))
    reader_port = free_port()
    raw: dict[str, Any] = {
        "server_name": "bench.local",
        "data_dir": str(work / "data"),
        "database": {"engine": "postgres", "dsn": dsn, "schema": schema},
        "stream_writers": {
            stream: ["writer"]
            for stream in ("events", "account_data", "receipts", "to_device", "typing")
        },
        "instances": {
            "writer": {"replication_port": free_port(), "http_port": free_port()},
            "reader": {"http_port": reader_port},
        },
    }
    if args.cache_size is not None:
        raw["caches"] = {"events": args.cache_size, "formatted_events": args.cache_size}
    config = work / "roomstream.yaml"
    config.write_text(yaml.safe_dump(raw), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "ROOMSTREAM_CONFIG"}
    reader_env = dict(env)
    if args.trace:
        hook = work / "hook"
        hook.mkdir()
        (hook / "sitecustomize.py").write_text(_TRACE_HOOK, encoding="utf-8")
        Path(args.trace).mkdir(parents=True, exist_ok=True)
        reader_env["PYTHONPATH"] = f"{hook}{os.pathsep}{env.get('PYTHONPATH', '')}"
        reader_env["ROOMSTREAM_TRACE_DIR"] = str(Path(args.trace).resolve())
    return schema, reader_port, config, env, reader_env


async def run(args: argparse.Namespace) -> dict[str, Any]:
    dsn = common.PG_ADMIN_DSN
    schema, reader_port, config, env, reader_env = prepare(args)
    writer = await start(config, "writer", env)
    reader = await start(config, "reader", reader_env)
    base = f"http://127.0.0.1:{reader_port}"
    samples: list[dict[str, float]] = []
    sent = [0]
    try:
        async with aiohttp.ClientSession() as session:
            users = [Client(session, base) for _ in range(SENDERS)]
            ids = [await u.register(f"u{i}") for i, u in enumerate(users)]
            room = (await users[0].call("POST", "/createRoom", {"preset": "public_chat"}))[
                "room_id"
            ]
            for user in users[1:]:
                await user.call("POST", f"/join/{room}", {})
            stop = asyncio.Event()

            async def send(user: Client, index: int) -> None:
                n = 0
                while not stop.is_set():
                    n += 1
                    body = {"msgtype": "m.text", "body": f"message {n} from {ids[index]}"}
                    await user.call("PUT", f"/rooms/{room}/send/m.room.message/t{n}", body)
                    sent[0] += 1

            async def sync(user: Client) -> None:
                since = (await user.call("GET", "/sync?timeout=0"))["next_batch"]
                while not stop.is_set():
                    result = await user.call("GET", f"/sync?timeout=5000&since={since}")
                    since = result["next_batch"]

            tasks = [asyncio.create_task(send(u, i)) for i, u in enumerate(users)]
            tasks += [asyncio.create_task(sync(u)) for u in users]
            started = time.monotonic()
            while (elapsed := time.monotonic() - started) < args.seconds:
                samples.append(
                    {
                        "seconds": round(elapsed, 1),
                        "messages": sent[0],
                        "writer_mb": round(resident_mb(writer.pid), 1),
                        "reader_mb": round(resident_mb(reader.pid), 1),
                    }
                )
                if args.trace:
                    reader.send_signal(signal.SIGUSR2)
                print(samples[-1], flush=True)
                await asyncio.sleep(args.sample)  # sampling period, not synchronisation
            stop.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        for process in (reader, writer):
            process.send_signal(signal.SIGTERM)
            await process.wait()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    third = samples[len(samples) * 2 // 3]
    last = samples[-1]
    return {
        "senders": SENDERS,
        "cache_size": args.cache_size,
        "seconds": args.seconds,
        "messages": sent[0],
        "samples": samples,
        "reader_growth_last_third_mb": round(last["reader_mb"] - third["reader_mb"], 1),
        "writer_growth_last_third_mb": round(last["writer_mb"] - third["writer_mb"], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="60 s instead of 360 s")
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--sample", type=float, default=5.0, help="seconds between samples")
    parser.add_argument(
        "--cache-size",
        type=int,
        default=None,
        help="caches.events and caches.formatted_events (default: the configuration's)",
    )
    parser.add_argument("--trace", default=None, help="dump reader tracemalloc snapshots here")
    args = parser.parse_args()
    if args.seconds is None:
        args.seconds = 60.0 if args.quick else 360.0
    results = asyncio.run(run(args))
    name = "memory" if args.cache_size is None else f"memory.caches-{args.cache_size}"
    path = common.write_results(name, results, args.quick)
    print(f"reader grew {results['reader_growth_last_third_mb']} MB in the last third;")
    print(f"writer grew {results['writer_growth_last_third_mb']} MB; {path}")
    print(common.describe_machine(common.machine_info()))


if __name__ == "__main__":
    main()
