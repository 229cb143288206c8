"""The ``roomstream`` command."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from roomstream.config import Config, ConfigError, load_config
from roomstream.storage import connect, prepare_database
from roomstream.streams import StreamSet

console = Console()

Command = Callable[[Config, argparse.Namespace], Coroutine[Any, Any, int]]


async def cmd_migrate(config: Config, args: argparse.Namespace) -> int:
    db = connect(config.database)
    try:
        version = await prepare_database(db)
    finally:
        await db.close()
    console.print(f"schema at version {version} ({config.database.engine})")
    return 0


async def cmd_streams(config: Config, args: argparse.Namespace) -> int:
    """Show every stream's writers and positions, as this instance sees them."""
    db = connect(config.database)
    try:
        await prepare_database(db)
        streams = await StreamSet.open(db, config.instance_name, config.stream_writers)
        table = Table("stream", "writer", "position", "linear position")
        for name in streams.names:
            generator = streams.generator(name)
            for writer, position in generator.get_positions().items():
                table.add_row(name, writer, str(position), str(generator.get_linear_position()))
        console.print(table)
    finally:
        await db.close()
    return 0


async def cmd_run(config: Config, args: argparse.Namespace) -> int:
    from roomstream.app import run_demo, run_with_demo_traffic
    from roomstream.replication.worker import run_instance

    if args.instance:
        config = config.with_instance(args.instance)
    if args.once:
        return await run_demo(config, console)
    if args.demo:
        return await run_with_demo_traffic(config, console)
    return await run_instance(config, console, record_path=args.record)


async def cmd_views(config: Config, args: argparse.Namespace) -> int:
    """Maintain (or rebuild) the derived room/user views with Spark."""
    import os

    from roomstream.pipelines.views import rebuild_views_cli, run_views

    loop = asyncio.get_running_loop()
    if args.rebuild:
        offset = await loop.run_in_executor(
            None,
            lambda: rebuild_views_cli(
                config.database, master=args.master, parquet_path=args.parquet
            ),
        )
        console.print(f"views rebuilt up to {offset}")
        return 0
    checkpoint = args.checkpoint or os.path.join(config.data_dir, "checkpoints", "views")
    await loop.run_in_executor(
        None,
        lambda: run_views(
            config.database,
            checkpoint,
            master=args.master,
            parquet_path=args.parquet,
            once=not args.follow,
        ),
    )
    console.print("views up to date" if not args.follow else "views job stopped")
    return 0


async def cmd_generate(config: Config, args: argparse.Namespace) -> int:
    from roomstream.corpus import generate_cli

    return generate_cli(
        args.path,
        events=args.events,
        seed=args.seed,
        malformed=args.malformed,
        workers=args.workers,
    )


async def cmd_import(config: Config, args: argparse.Namespace) -> int:
    from roomstream.pipelines.importer import import_cli

    # import_cli drives Spark and runs its own event loop: keep it off this one.
    return await asyncio.to_thread(
        import_cli,
        args.path,
        config.database,
        instance_name=config.instance_name,
        stream_writers=config.stream_writers,
        backfill=args.backfill,
        master=args.master,
        partitions=args.partitions,
        report_path=args.report,
    )


COMMANDS: dict[str, tuple[Command, str]] = {
    "run": (cmd_run, "set up the database and run this instance until interrupted"),
    "migrate": (cmd_migrate, "apply schema migrations and exit"),
    "streams": (cmd_streams, "show stream writers and positions"),
    "views": (cmd_views, "update the derived room/user views with Spark"),
    "generate": (cmd_generate, "write a generated corpus of signed PDUs (JSON lines)"),
    "import": (cmd_import, "bulk-import a file of PDUs (JSON lines) with Spark"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="roomstream", description=__doc__)
    parser.add_argument("-c", "--config", help="YAML configuration file (default: none needed)")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (_, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        if name == "run":
            p.add_argument("--instance", help="instance_name to run as (overrides the file)")
            p.add_argument("--once", action="store_true", help="run the demo job and exit")
            p.add_argument(
                "--demo", action="store_true", help="also send demo events every 2 seconds"
            )
            p.add_argument("--record", help="append processed stream facts to a JSON-lines file")
        if name == "generate":
            p.add_argument("path")
            p.add_argument("--events", type=int, default=100_000)
            p.add_argument("--seed", type=int, default=0)
            p.add_argument("--malformed", type=int, default=0, help="add this many bad lines")
            p.add_argument("--workers", type=int, help="signing processes (default: cores)")
        if name == "import":
            p.add_argument("path")
            p.add_argument("--backfill", action="store_true", help="as history (negative IDs)")
            p.add_argument("--master", default="local[2]", help="Spark master URL")
            p.add_argument("--partitions", type=int)
            p.add_argument("--report", help="write every issue as JSON lines here")
        if name == "views":
            p.add_argument("--master", default="local[2]", help="Spark master URL")
            p.add_argument("--rebuild", action="store_true", help="rebuild from scratch (batch)")
            p.add_argument("--follow", action="store_true", help="keep streaming until stopped")
            p.add_argument("--checkpoint", help="streaming checkpoint directory")
            p.add_argument("--parquet", help="also write the views as Parquet here")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        console.print(f"[red]configuration error:[/red] {exc}")
        return 2
    command, _ = COMMANDS[args.command]
    try:
        return asyncio.run(command(config, args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
