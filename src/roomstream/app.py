"""What ``roomstream run`` does for an instance."""

from __future__ import annotations

import time

import orjson
from rich.console import Console

from roomstream.config import Config
from roomstream.storage import Transaction, connect, prepare_database
from roomstream.streams import StreamSet


def _write_invalidation(txn: Transaction, stream_id: int, instance: str, key: str) -> None:
    txn.execute(
        "INSERT INTO cache_invalidations (stream_id, instance_name, cache_func, keys,"
        " invalidation_ts) VALUES (?, ?, ?, ?, ?)",
        (
            stream_id,
            instance,
            "get_user_by_id",
            orjson.dumps([key]).decode(),
            int(time.time() * 1000),
        ),
    )


def _now_ms() -> int:
    return int(time.time() * 1000)


async def run_main_job(config: Config, console: Console, once: bool = True) -> int:
    """Prepare the database, write facts to a stream and read them back through it."""
    db = connect(config.database)
    try:
        version = await prepare_database(db)
        where = config.database.path if config.database.engine == "sqlite" else config.database.dsn
        console.print(
            f"[bold]roomstream[/bold] instance {config.instance_name!r} on "
            f"{config.database.engine} ({where}), schema v{version}"
        )
        streams = await StreamSet.open(db, config.instance_name, config.stream_writers)
        caches = streams.generator("caches")
        before = caches.get_position(config.instance_name)
        for n in range(3):
            async with caches.reserve() as stream_id:
                await db.run_interaction(
                    _write_invalidation,
                    stream_id,
                    config.instance_name,
                    f"@user{n}:{config.server_name}",
                )
        after = caches.get_position(config.instance_name)
        updates, _, _ = await streams.get_updates(
            "caches", config.instance_name, before, after, 100
        )
        for token, row in updates:
            console.print(
                f"RDATA caches {config.instance_name} {token} {orjson.dumps(row).decode()}"
            )
        console.print(f"caches stream: {before} -> {after}, linear {caches.get_linear_position()}")
    finally:
        await db.close()
    return 0
