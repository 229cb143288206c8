"""Replication benchmarks: TCP RDATA throughput, and commit-to-reader latency.

1. ``throughput``: one TCP connection. A separate process plays a writer that has
   already serialised N ``RDATA events`` lines (realistic event rows) and writes them as
   fast as the socket takes them after answering ``REPLICATE``; this process runs the real
   client (:class:`ReplicationClient`: framing, parsing, direction checks, the follower's
   duplicate/ordering rules and a callback per token). Figure: RDATA lines received and
   processed per second, from the POSITION to the last row. Target: >= 100,000/s.
2. ``latency``: a real writer node (this process) and a real reader node (another
   process) on PostgreSQL, over TCP and over Redis. The writer commits ``caches`` facts at
   a fixed rate (1,000 and 10,000 facts/s; one reservation and one transaction per 10 ms
   tick) and notes the time each transaction committed; the reader notes when it
   processed each fact. Both use CLOCK_MONOTONIC, which is shared by all processes on
   Linux. The latency therefore covers storing the position, the position listener, the
   writer reading the rows back, the wire, parsing and processing. Target: p99 <= 5 ms at
   1,000 facts/s.

Run ``python bench/bench_replication.py [--quick]``; results go to
``bench/results/replication.json`` (``replication.quick.json`` in quick mode).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import gc
import itertools
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import yaml
from psycopg import sql

from common import (
    PG_ADMIN_DSN,
    describe_machine,
    fmt_rate,
    machine_info,
    markdown_table,
    write_results,
)
from roomstream.config import Config, parse_config
from roomstream.homeserver import Homeserver, open_room_engine
from roomstream.replication import endpoints as ep
from roomstream.replication.commands import PositionCommand, RdataCommand, serialize
from roomstream.replication.follower import StreamFollower
from roomstream.replication.http import InternalHttpClient
from roomstream.replication.tcp import ReplicationClient
from roomstream.replication.worker import ReplicationNode
from roomstream.storage import Transaction

TARGET_THROUGHPUT = 100_000.0  # RDATA lines/s on one connection
TARGET_P99_MS_AT_1000 = 5.0
TICK = 0.010  # seconds between writer transactions in the latency benchmark
MAX_IN_FLIGHT = 4  # writer transactions under way at once
HERE = Path(__file__).resolve()


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- 1. throughput ---------------------------------------------------------------------


def _blob(lines: int) -> bytes:
    out = []
    for i in range(1, lines + 1):
        row = (
            "ev",
            (
                f"$ev{i:010d}abcdefghijklmnopqrstuvwxyz0123",
                "!roomabcdefghijklmnop:bench.example",
                "m.room.message",
                None,
                None,
                None,
                None,
                False,
                False,
            ),
        )
        out.append(serialize(RdataCommand("events", "w1", i, row)))
    return b"".join(out)


async def _blob_server(lines: int, port_file: Path) -> None:
    blob = _blob(lines)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"SERVER bench.example\nPING 0\n")
        while True:
            line = await reader.readline()
            if not line:
                return
            if line.startswith(b"REPLICATE"):
                break
        writer.write(serialize(PositionCommand("events", "w1", 0, 0)))
        view = memoryview(blob)
        for start in range(0, len(blob), 1 << 20):
            writer.write(view[start : start + (1 << 20)])
            await writer.drain()
        await reader.read()  # until the client goes away
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port_file.write_text(str(server.sockets[0].getsockname()[1]))  # noqa: ASYNC240 (a few bytes, once)
    async with server:
        await server.serve_forever()


async def bench_throughput_once(lines: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        port_file = Path(tmp) / "port"
        proc = subprocess.Popen(  # noqa: ASYNC220 (starts a helper, once)
            [
                sys.executable,
                str(HERE),
                "--role",
                "blob-server",
                "--lines",
                str(lines),
                "--port-file",
                str(port_file),
            ]
        )
        try:
            deadline = time.monotonic() + 60
            while not port_file.exists() or not port_file.read_text():
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("blob server did not start")
                await asyncio.sleep(0.02)
            port = int(port_file.read_text())
            done = asyncio.get_running_loop().create_future()
            state = {"rows": 0}

            class Counter:
                def process(self, stream: str, writer: str, token: int, rows: list[Any]) -> None:
                    state["rows"] += len(rows)
                    if state["rows"] >= lines and not done.done():
                        done.set_result(time.perf_counter())

                def advanced(self, stream: str, writer: str, token: int) -> None:
                    pass

            follower = StreamFollower(Counter(), ["events"], {("events", "w1"): 0})

            async def no_fetch(*args: Any) -> tuple[list[Any], int, bool]:
                raise AssertionError("no gap expected")

            client = ReplicationClient(
                "127.0.0.1", port, client_name="bench", expected_server_name="bench.example",
                follower=follower, fetch=no_fetch,
            )  # fmt: skip
            started = time.perf_counter()
            client.start()
            end = await asyncio.wait_for(done, 300)
            await client.stop()
            # From connecting to the last row processed (the handshake is ~1 ms of it).
            seconds = end - started
            return {"lines": lines, "seconds": seconds, "rdata_per_s": lines / seconds}
        finally:
            proc.terminate()
            proc.wait(10)


async def bench_throughput(lines: int, repeats: int) -> dict[str, Any]:
    runs = [await bench_throughput_once(lines) for _ in range(repeats)]
    best = max(runs, key=lambda r: r["rdata_per_s"])
    return {
        "lines": lines,
        "runs": [r["rdata_per_s"] for r in runs],
        "best_rdata_per_s": best["rdata_per_s"],
        "median_rdata_per_s": statistics.median(r["rdata_per_s"] for r in runs),
        "target": TARGET_THROUGHPUT,
        "met": best["rdata_per_s"] >= TARGET_THROUGHPUT,
    }


# -- 2. latency ------------------------------------------------------------------------


def _facts_txn(txn: Transaction, ids: list[int], seqs: list[int]) -> None:
    # The same row as roomstream.caches.stream_invalidation_txn writes, in one batch.
    txn.executemany(
        "INSERT INTO cache_invalidations (stream_id, instance_name, cache_func, keys,"
        " invalidation_ts) VALUES (?, ?, ?, ?, ?)",
        [(i, "w1", "bench", f"[{seq}]", 0) for i, seq in zip(ids, seqs, strict=True)],
    )


def _make_config(transport: str, dsn: str, workdir: Path) -> tuple[dict[str, Any], Config]:
    raw = {
        "server_name": f"bench-{uuid.uuid4().hex[:8]}.example",
        "data_dir": str(workdir / "data"),
        "database": {"engine": "postgres", "dsn": dsn, "pool_min": 2, "pool_max": 8},
        "stream_writers": {"caches": ["w1"], "events": ["w1"]},
        "instances": {
            "w1": {"replication_port": free_port(), "internal_port": free_port()},
            "reader": {"internal_port": free_port()},
        },
        "replication": {"transport": transport, "max_outbound_lines": 100_000},
    }
    return raw, parse_config(raw)


async def _poll(check: Callable[[], Any], limit: float, what: str) -> Any:
    deadline = time.monotonic() + limit
    while True:
        try:
            result = await check()
        except Exception:
            result = None
        if result:
            return result
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def bench_latency_case(
    transport: str, rate_per_s: int, seconds: float, dsn: str, workdir: Path, commit_mode: str
) -> dict[str, Any]:
    raw, config = _make_config(transport, dsn, workdir)
    config_path = workdir / f"config-{transport}-{rate_per_s}.yaml"
    config_path.write_text(yaml.safe_dump(raw))
    out_path = workdir / f"reader-{transport}-{rate_per_s}.json"
    engine = await open_room_engine(config.with_instance("w1"))
    server = Homeserver(config.with_instance("w1"), engine)
    node = server.replication
    await server.start()
    reader = subprocess.Popen(  # noqa: ASYNC220 (starts a helper, once)
        [
            sys.executable,
            str(HERE),
            "--role",
            "reader",
            "--config",
            str(config_path),
            "--out",
            str(out_path),
        ]
    )
    http = InternalHttpClient(config)
    try:

        async def reader_ready() -> bool:
            health = await http.call(ep.HEALTH, "reader", ep.HealthCall())
            return "w1" in health["positions"].get("caches", {})

        await _poll(reader_ready, 60, "reader")
        generator = engine.streams.generator("caches")
        commits: dict[int, tuple[int, int]] = {}  # seq -> (stream id, commit ns)
        announced: list[tuple[int, int]] = []  # (position, ns) as the listener saw them
        generator.add_position_listener(
            lambda _w, pos: announced.append((pos, time.monotonic_ns()))
        )
        in_flight: set[asyncio.Task[None]] = set()
        slots = asyncio.Semaphore(MAX_IN_FLIGHT)

        async def write(seqs: list[int]) -> None:
            try:
                async with generator.reserve_many(len(seqs)) as ids:
                    await engine.db.run_interaction("facts", _facts_txn, ids, seqs)
                    committed = time.monotonic_ns()
                    for s, i in zip(seqs, ids, strict=True):
                        commits[s] = (i, committed)
            finally:
                slots.release()

        seq = 0
        loop = asyncio.get_running_loop()
        start = loop.time()
        next_tick = start
        while loop.time() - start < seconds:
            due = int((loop.time() - start) * rate_per_s) - seq
            if due > 0:
                await slots.acquire()
                task = asyncio.create_task(write(list(range(seq, seq + due))))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
                seq += due
            next_tick += TICK
            delay = next_tick - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
        await asyncio.gather(*in_flight)
        elapsed = loop.time() - start
        target = node.broadcaster.stored_token("caches")

        async def caught_up() -> bool:
            health = await http.call(ep.HEALTH, "reader", ep.HealthCall())
            return bool(health["positions"]["caches"]["w1"] >= target)

        await _poll(caught_up, 120, "reader caught up")
    finally:
        reader.send_signal(signal.SIGTERM)
        reader.wait(30)
        await http.close()
        await server.stop()
        await engine.close()
    processed: dict[str, int] = json.loads(out_path.read_text())
    missing = [s for s in commits if str(s) not in processed]
    if missing:
        raise RuntimeError(f"{len(missing)} facts never reached the reader")
    warmup = int(rate_per_s * 0.5)
    announced.sort()
    positions = [p for p, _ in announced]
    # The first time a position at or above an ID was announced: later announcements can
    # carry lower positions only if they were reordered, so take the suffix minimum.
    first_announce = list(itertools.accumulate((t for _, t in reversed(announced)), min))[::-1]
    from_commit: list[float] = []
    from_announce: list[float] = []
    for s, (stream_id, committed) in commits.items():
        if s < warmup:
            continue
        done = processed[str(s)]
        from_commit.append((done - committed) / 1e6)
        k = bisect.bisect_left(positions, stream_id)
        from_announce.append((done - first_announce[k]) / 1e6)
    from_commit.sort()
    from_announce.sort()

    def pct(values: list[float], p: float) -> float:
        return values[min(len(values) - 1, int(p * len(values)))]

    return {
        "transport": transport,
        "commit": commit_mode,
        "rate": rate_per_s,
        "achieved_rate": len(commits) / elapsed,
        "facts": len(commits),
        "p50_ms": pct(from_commit, 0.50),
        "p99_ms": pct(from_commit, 0.99),
        "max_ms": from_commit[-1],
        "announce_p50_ms": pct(from_announce, 0.50),
        "announce_p99_ms": pct(from_announce, 0.99),
    }


async def _reader_role(config_path: str, out: str) -> None:
    from roomstream.config import load_config

    config = load_config(config_path).with_instance("reader")
    engine = await open_room_engine(config)
    node = ReplicationNode(config, engine)
    seen: dict[int, int] = {}
    inner = node.process

    class Callbacks:
        def process(self, stream: str, writer: str, token: int, rows: list[Any]) -> None:
            now = time.monotonic_ns()
            if stream == "caches":
                for row in rows:
                    seen[row[1][0]] = now
            inner(stream, writer, token, rows)

        def advanced(self, stream: str, writer: str, token: int) -> None:
            node.advanced(stream, writer, token)

    node.follower.callbacks = Callbacks()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await node.start()
    await stop.wait()
    await node.stop()
    await engine.close()
    Path(out).write_text(json.dumps(seen))  # noqa: ASYNC240 (after the run)


# -- driver ----------------------------------------------------------------------------


def _create_db() -> tuple[str, Callable[[], None]]:
    name = f"roomstream_bench_repl_{os.getpid()}"
    drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True, connect_timeout=5) as admin:
        admin.execute(drop)
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))

    def cleanup() -> None:
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True, connect_timeout=5) as admin:
            admin.execute(drop)

    base, _, _ = PG_ADMIN_DSN.rpartition("/")
    return f"{base}/{name}", cleanup


def _set_synchronous_commit(dsn: str, value: str) -> None:
    name = dsn.rpartition("/")[2]
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True, connect_timeout=5) as admin:
        admin.execute(
            sql.SQL("ALTER DATABASE {} SET synchronous_commit = {}").format(
                sql.Identifier(name), sql.Literal(value)
            )
        )


async def run(
    quick: bool, transports: list[str], rates: list[int], commit_modes: list[str]
) -> dict[str, Any]:
    lines, repeats = (100_000, 2) if quick else (300_000, 3)
    seconds = 3.0 if quick else 10.0
    log(f"throughput: {lines} RDATA lines x {repeats}")
    throughput = await bench_throughput(lines, repeats)
    log(f"  best {fmt_rate(throughput['best_rdata_per_s'])} RDATA/s")
    latency = []
    dsn, cleanup = _create_db()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            # "durable": PostgreSQL defaults (every commit waits for its WAL fsync);
            # "async-commit": synchronous_commit=off for the bench database, to show what
            # replication itself costs once the disk's fsync time is out of the picture.
            for commit_mode in commit_modes:
                _set_synchronous_commit(dsn, "on" if commit_mode == "durable" else "off")
                for transport in transports:
                    for rate_per_s in rates:
                        log(f"latency: {commit_mode} {transport} at {rate_per_s}/s")
                        case = await bench_latency_case(
                            transport, rate_per_s, seconds, dsn, Path(tmp), commit_mode
                        )
                        log(
                            f"  p50 {case['p50_ms']:.2f} ms, p99 {case['p99_ms']:.2f} ms;"
                            f" from announce p99 {case['announce_p99_ms']:.2f} ms"
                            f" (achieved {case['achieved_rate']:.0f}/s)"
                        )
                        latency.append(case)
    finally:
        cleanup()
    at_1000 = [c for c in latency if c["rate"] == 1_000]
    return {
        "throughput": throughput,
        "latency": latency,
        "latency_target_p99_ms_at_1000": TARGET_P99_MS_AT_1000,
        "latency_met": {
            f"{c['commit']}/{c['transport']}": c["p99_ms"] <= TARGET_P99_MS_AT_1000 for c in at_1000
        },
    }


def report(results: dict[str, Any]) -> str:
    t = results["throughput"]
    rows = [
        [
            c["commit"],
            c["transport"],
            fmt_rate(c["rate"]),
            fmt_rate(c["achieved_rate"]),
            f"{c['p50_ms']:.2f}",
            f"{c['p99_ms']:.2f}",
            f"{c['max_ms']:.2f}",
            f"{c['announce_p50_ms']:.2f}",
            f"{c['announce_p99_ms']:.2f}",
        ]
        for c in results["latency"]
    ]
    return (
        f"TCP RDATA throughput: best {fmt_rate(t['best_rdata_per_s'])}/s "
        f"(runs: {', '.join(fmt_rate(r) for r in t['runs'])}); target "
        f"{fmt_rate(t['target'])}/s: {'met' if t['met'] else 'NOT met'}\n\n"
        + markdown_table(
            [
                "commit",
                "transport",
                "target facts/s",
                "achieved",
                "p50 ms",
                "p99 ms",
                "max ms",
                "announce→reader p50",
                "announce→reader p99",
            ],
            rows,
        )
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, under 2 minutes")
    parser.add_argument("--transports", default="tcp,redis")
    parser.add_argument(
        "--rates", default="1000,10000", help="facts/s for the latency runs, comma-separated"
    )
    parser.add_argument(
        "--commit-modes", default="durable,async-commit", help="durable and/or async-commit"
    )
    parser.add_argument(
        "--gc-threshold",
        type=int,
        default=0,
        help="if set, gen-0 GC threshold in every benchmark process (default: Python's)",
    )
    parser.add_argument("--role", choices=["blob-server", "reader"], help=argparse.SUPPRESS)
    parser.add_argument("--lines", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port-file", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.gc_threshold:
        gc.set_threshold(args.gc_threshold, 50, 100)
        os.environ["ROOMSTREAM_BENCH_GC"] = str(args.gc_threshold)
    elif os.environ.get("ROOMSTREAM_BENCH_GC"):
        gc.set_threshold(int(os.environ["ROOMSTREAM_BENCH_GC"]), 50, 100)
    if args.role == "blob-server":
        asyncio.run(_blob_server(args.lines, Path(args.port_file)))
        return 0
    if args.role == "reader":
        asyncio.run(_reader_role(args.config, args.out))
        return 0
    results = asyncio.run(
        run(
            args.quick,
            args.transports.split(","),
            [int(r) for r in args.rates.split(",")],
            args.commit_modes.split(","),
        )
    )
    results["gc_threshold"] = args.gc_threshold or gc.get_threshold()[0]
    path = write_results("replication", results, args.quick)
    info = machine_info()
    print(f"Machine: {describe_machine(info)}\n")
    print(report(results))
    print(f"\nwritten to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
