"""Shared helpers for the benchmark scripts: machine description, timing, JSON results.

Each ``bench/bench_*.py`` script imports this module as ``common`` (the script's own
directory is first on ``sys.path``), measures one area and calls :func:`write_results`,
which stores ``bench/results/<name>.json`` together with :func:`machine_info`.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import platform
import sqlite3
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import psycopg

from roomstream.storage import Database, Transaction

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"

#: Admin connection used to create and drop throwaway benchmark databases.
PG_ADMIN_DSN = os.environ.get(
    "ROOMSTREAM_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres"
)


# -- databases under test --------------------------------------------------------------


def _analyze_txn(txn: Transaction) -> None:
    txn.execute("ANALYZE")


def _vacuum_and_checkpoint(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE)")
        conn.execute("CHECKPOINT")


async def settle_database(db: Database, dsn: str | None) -> None:
    """After bulk writes: fresh statistics, and (PostgreSQL, ``dsn`` given) a vacuum and a
    checkpoint. Without it, autovacuum, hint-bit writes and a checkpoint land in the middle
    of the next measurement on a 2-core machine and make it noisy."""
    await db.run_interaction("analyze", _analyze_txn)
    if dsn is not None:
        await asyncio.to_thread(_vacuum_and_checkpoint, dsn)


# -- machine ---------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def _package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def postgres_server_version(dsn: str = PG_ADMIN_DSN) -> str | None:
    """The server's version string, or None if it cannot be reached."""
    try:
        import psycopg

        with psycopg.connect(dsn, connect_timeout=3) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            return str(row[0]) if row else None
    except Exception:
        return None


def machine_info() -> dict[str, Any]:
    """What the figures were measured on: CPU, cores, memory, Python, engine versions."""
    return {
        "cpu_model": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "sqlite": sqlite3.sqlite_version,
        "postgres": postgres_server_version(),
        "psycopg": _package_version("psycopg"),
        "roomstream": _package_version("roomstream"),
        # Other work on the machine while measuring (1, 5, 15 min); the cores are shared.
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def describe_machine(info: dict[str, Any]) -> str:
    """One line for a report header."""
    return (
        f"{info['cpu_model']}, {info['cores']} cores, {info['memory_gib']} GiB; "
        f"Python {info['python']}; SQLite {info['sqlite']}; "
        f"PostgreSQL {info['postgres'] or 'n/a'}; psycopg {info['psycopg'] or 'n/a'}"
    )


# -- timing ----------------------------------------------------------------------------


@dataclass
class Timer:
    """Wall-clock seconds of a ``with timed() as t:`` block, in ``t.seconds``."""

    start: float = field(default_factory=time.perf_counter)
    seconds: float = 0.0


@contextmanager
def timed() -> Iterator[Timer]:
    timer = Timer()
    try:
        yield timer
    finally:
        timer.seconds = time.perf_counter() - timer.start


def best_of(repeats: int, func: Callable[[], float]) -> tuple[float, list[float]]:
    """Run ``func`` (which returns a measured duration) ``repeats`` times; (min, all)."""
    runs = [func() for _ in range(repeats)]
    return min(runs), runs


def median(values: list[float]) -> float:
    return statistics.median(values)


def rate(count: float, seconds: float) -> float:
    """Items per second, guarding against a zero duration."""
    return count / seconds if seconds > 0 else float("inf")


def fmt_rate(value: float) -> str:
    """Thousands separators, no decimals: ``123,456``."""
    return f"{value:,.0f}"


# -- results ---------------------------------------------------------------------------


def write_results(name: str, results: dict[str, Any], quick: bool) -> Path:
    """Write ``bench/results/<name>.json`` (``<name>.quick.json`` in quick mode)."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / (f"{name}.quick.json" if quick else f"{name}.json")
    document = {
        "benchmark": name,
        "mode": "quick" if quick else "full",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "argv": sys.argv,
        "machine": machine_info(),
        "results": results,
    }
    path.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return path


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub-flavoured Markdown table; numbers are expected pre-formatted."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
