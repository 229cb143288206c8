"""The ``roomstream`` command."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from roomstream.config import Config, ConfigError, load_config
from roomstream.storage import DatabaseUnavailableError, connect, prepare_database
from roomstream.streams import StreamSet

console = Console()

Command = Callable[[Config, argparse.Namespace], Coroutine[Any, Any, int]]


async def cmd_migrate(config: Config, args: argparse.Namespace) -> int:
    """Apply the migrations, then rebuild the visibility records and the relations and
    search indexes they listed (rooms persisted before schema 5, 16 and 17, or loaded by
    the bulk import), so that the server starts with every room complete."""
    from roomstream.reading.backfill import VisibilityBackfill
    from roomstream.reading.index_backfill import IndexBackfill

    db = connect(config.database)
    try:
        version = await prepare_database(db)
        console.print(f"schema at version {version} ({config.database.engine})")
        done = await VisibilityBackfill(db).run_pending()
        if done.rooms:
            console.print(f"visibility records rebuilt: {done.rooms} rooms, {done.events} events")
        indexed = await IndexBackfill(db).run_pending()
        if indexed.rooms:
            console.print(
                f"relations and search indexed: {indexed.rooms} rooms, {indexed.events} events"
            )
    finally:
        await db.close()
    return 0


async def cmd_rebuild_visibility(config: Config, args: argparse.Namespace) -> int:
    """Rebuild the read side's visibility records from the stored events and state."""
    from roomstream.reading.backfill import VisibilityBackfill

    db = connect(config.database)
    try:
        await prepare_database(db)
        backfill = VisibilityBackfill(db, batch_size=args.batch_size)
        reset = not args.missing_only
        if args.room:
            done = await backfill.rebuild_room(args.room, reset=reset)
        else:
            done = await backfill.rebuild_all(reset=reset)
    finally:
        await db.close()
    console.print(
        f"visibility records {'rebuilt' if reset else 'completed'}: {done.rooms} rooms,"
        f" {done.events} events recorded in {done.batches} transactions"
    )
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
    from roomstream.demo import run_demo, run_with_demo_traffic
    from roomstream.homeserver import ViewsJob, run_instance

    if args.instance:
        config = config.with_instance(args.instance)
    if args.once:
        return await run_demo(config, console)
    views = config.run_views_job if args.views is None else args.views
    job = ViewsJob.for_config(config, args.config) if views else None
    if job is not None:
        db = connect(config.database)  # the schema first: the job reads and writes it
        try:
            await prepare_database(db)
        finally:
            await db.close()
        await job.start()
    try:
        if args.demo:
            return await run_with_demo_traffic(config, console)
        return await run_instance(
            config, console, record_path=args.record, socket_buffer=args.socket_buffer
        )
    finally:
        if job is not None:
            await job.stop()


async def cmd_register(config: Config, args: argparse.Namespace) -> int:
    """Create a local user, as Synapse's ``register_new_matrix_user`` does (works with
    registration closed)."""
    import getpass

    from roomstream.accounts import Accounts, AccountStore
    from roomstream.errors import MatrixError

    password = args.password
    if password is None:
        password = getpass.getpass(f"password for {args.username}: ")
        if getpass.getpass("again: ") != password:
            console.print("[red]the passwords differ[/red]")
            return 2
    db = connect(config.database)
    try:
        await prepare_database(db)
        accounts = Accounts(AccountStore(db), config.server_name)
        try:
            created = await accounts.create_account(args.username, password, admin=args.admin)
        except MatrixError as exc:
            console.print(f"[red]{exc.errcode}:[/red] {exc.message}")
            return 1
    finally:
        await db.close()
    console.print(f"registered {created.user_id}" + (" (admin)" if args.admin else ""))
    return 0


async def cmd_views(config: Config, args: argparse.Namespace) -> int:
    """Maintain (or rebuild) the derived room/user views with Spark."""
    import os

    from roomstream.pipelines.views import rebuild_views_cli, run_views

    loop = asyncio.get_running_loop()
    quiet = not args.verbose
    where = "PostgreSQL" if config.database.engine == "postgres" else config.database.path
    offset: dict[str, int] | None = None
    with console.status(f"updating the views in {where} with Spark ({args.master})"):
        if args.rebuild:
            offset = await loop.run_in_executor(
                None,
                lambda: rebuild_views_cli(
                    config.database, master=args.master, parquet_path=args.parquet, quiet=quiet
                ),
            )
        else:
            checkpoint = args.checkpoint or os.path.join(config.data_dir, "checkpoints", "views")
            await loop.run_in_executor(
                None,
                lambda: run_views(
                    config.database,
                    checkpoint,
                    master=args.master,
                    parquet_path=args.parquet,
                    once=not args.follow,
                    quiet=quiet,
                ),
            )
    await _print_views_summary(config, args.parquet, offset)
    if args.follow:
        console.print("views job stopped")
    return 0


async def _print_views_summary(
    config: Config, parquet: str | None, offset: dict[str, int] | None
) -> None:
    """Which tables (and Parquet directories) hold the views, and what is in them."""
    from roomstream.pipelines.views import parquet_paths, views_summary_txn

    db = connect(config.database)
    try:
        summary = await db.run_interaction("views_summary", views_summary_txn)
    finally:
        await db.close()
    where = (
        f"PostgreSQL ({config.database.schema or 'public'} schema)"
        if config.database.engine == "postgres"
        else f"SQLite {config.database.path}"
    )
    paths = parquet_paths(parquet) if parquet else {}
    table = Table("table", "rows", "Parquet", title=f"views written to {where}")
    for name, rows in summary.rows.items():
        table.add_row(name, f"{rows:,}", paths.get(name, "-"))
    console.print(table)
    covered = ""
    if offset is not None:
        covered = " (events stream up to " + ", ".join(f"{w} {t}" for w, t in offset.items()) + ")"
    busiest = (
        f"; busiest day {summary.busiest_day[0]} with {summary.busiest_day[1]:,} messages"
        if summary.busiest_day
        else ""
    )
    console.print(
        f"{summary.rooms:,} rooms, {summary.users:,} users, {summary.messages:,} messages"
        f"{busiest}{covered}",
        highlight=False,
    )


def _local_key_map(config: Config) -> dict[str, dict[str, str]]:
    """The local server's verify key, if its signing key file exists (never created here)."""
    from roomstream.events.signing import load_or_create_signing_key, signing_key_path
    from roomstream.rooms.keys import local_key_map

    if not signing_key_path(config.data_dir, config.server_name).exists():
        return {}
    return local_key_map(
        config.server_name, load_or_create_signing_key(config.data_dir, config.server_name)
    )


async def cmd_keys(config: Config, args: argparse.Namespace) -> int:
    """``keys add SERVER KEY_ID KEY`` / ``keys import FILE`` / ``keys list``: the verify
    keys received events are checked against."""
    from roomstream.rooms.keys import ServerKeyStore, load_keys_file

    db = connect(config.database)
    try:
        await prepare_database(db)
        store = ServerKeyStore(db, _local_key_map(config))
        try:
            if args.keys_command == "add":
                added = await store.add(args.server, args.key_id, args.key)
                state = "added" if added else "already known:"
                console.print(f"{state} {args.server} {args.key_id}", markup=False)
            elif args.keys_command == "import":
                for server, by_id in sorted(load_keys_file(args.file).items()):
                    for kid, key in sorted(by_id.items()):
                        added = await store.add(server, kid, key)
                        state = "added" if added else "already known:"
                        console.print(f"{state} {server} {kid}", markup=False)
            else:
                table = Table("server", "key ID", "verify key", "source")
                local = store.local
                for server, by_id in sorted((await store.key_map()).items()):
                    for kid, key in sorted(by_id.items()):
                        source = "this server" if kid in local.get(server, {}) else "added"
                        table.add_row(server, kid, key, source)
                console.print(table)
        except ValueError as exc:
            console.print(f"[red]error:[/red] {exc}")
            return 2
    finally:
        await db.close()
    return 0


async def cmd_generate(config: Config, args: argparse.Namespace) -> int:
    from roomstream.devtools.corpus import generate_cli

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
        quiet=not args.verbose,
        keys_files=args.keys or (),
        local_keys=_local_key_map(config),
        trust_unsigned=args.trust_unsigned,
        work_dir=args.work_dir,
        server_name=config.server_name,
    )


def _gen_cert(config: Config, args: argparse.Namespace) -> int:
    from roomstream.federation.certs import self_signed

    server_name = args.server_name or config.server_name
    stem = Path(config.data_dir) / server_name.replace(":", "_")
    cert_path = Path(args.cert or f"{stem}.tls.crt")
    key_path = Path(args.key or f"{stem}.tls.key")
    existing = [str(p) for p in (cert_path, key_path) if p.exists()]
    if existing and not args.force:
        console.print(f"[red]error:[/red] {', '.join(existing)} exists (--force replaces it)")
        return 2
    pair = self_signed(server_name, args.days)
    for path in (cert_path, key_path):
        path.parent.mkdir(parents=True, exist_ok=True)
    # The key is never readable by others, not even for a moment.
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pair.private_key_pem)
    cert_path.write_bytes(pair.certificate_pem)
    console.print(
        f"wrote {cert_path} and {key_path} (self-signed for {server_name}, {args.days} days);"
        " set federation.tls_certificate_path and federation.tls_private_key_path to them",
        markup=False,
        soft_wrap=True,
    )
    return 0


async def cmd_gen_cert(config: Config, args: argparse.Namespace) -> int:
    """Write a self-signed TLS certificate and key for the federation listener."""
    return _gen_cert(config, args)


COMMANDS: dict[str, tuple[Command, str]] = {
    "run": (cmd_run, "set up the database and run this instance until interrupted"),
    "migrate": (cmd_migrate, "apply schema migrations (and the backfills they need) and exit"),
    "rebuild-visibility": (
        cmd_rebuild_visibility,
        "rebuild the read side's visibility records of one room or all from stored events",
    ),
    "streams": (cmd_streams, "show stream writers and positions"),
    "register": (cmd_register, "create a local user (Matrix account) with a password"),
    "views": (cmd_views, "update the derived room/user views with Spark"),
    "generate": (cmd_generate, "write a generated corpus of signed PDUs (JSON lines)"),
    "import": (cmd_import, "bulk-import a file of PDUs (JSON lines) with Spark"),
    "keys": (cmd_keys, "add or list the servers' verify keys received events are checked with"),
    "gen-cert": (cmd_gen_cert, "write a self-signed TLS certificate for federation (development)"),
}


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="roomstream", description=__doc__)
    parser.add_argument("-c", "--config", help="YAML configuration file (default: none needed)")
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="debug logs, and Spark's own logs and stage bars (quiet by default)",
    )
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
            p.add_argument(
                "--socket-buffer",
                type=_positive_int,
                help="SO_SNDBUF/SO_RCVBUF of replication connections, in bytes (tests of"
                " slow readers use it)",
            )
            p.add_argument(
                "--views",
                action=argparse.BooleanOptionalAction,
                default=None,
                help="also run the views streaming job (`roomstream views --follow`) in a"
                " child process, which keeps /publicRooms and /user_directory/search current"
                " (default: the run_views_job config key, false; `make run` turns it on)",
            )
        if name == "rebuild-visibility":
            p.add_argument("--room", help="only this room (default: every room with events)")
            p.add_argument(
                "--missing-only",
                action="store_true",
                help="only record events that have no record yet (default: delete the"
                " room's records and record every event again)",
            )
            p.add_argument(
                "--batch-size",
                type=_positive_int,
                default=1000,
                help="events per transaction (a persist into the room waits for one at most)",
            )
        if name == "register":
            p.add_argument("username", help="localpart, e.g. alice for @alice:server_name")
            p.add_argument("--password", help="(default: asked for on the terminal)")
            p.add_argument("--admin", action="store_true", help="make a server admin")
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
            p.add_argument(
                "--keys",
                action="append",
                metavar="FILE",
                help="verify keys of the servers that signed the input (JSON; repeatable;"
                " `roomstream generate` writes PATH.keys.json); added to those of"
                " `roomstream keys`",
            )
            p.add_argument(
                "--trust-unsigned",
                action="store_true",
                help="import events whose signatures cannot be verified (only for input"
                " whose origin you vouch for)",
            )
            p.add_argument(
                "--work-dir",
                help="scratch directory for the part databases (default: the system's"
                " temporary directory; needs about 5x the input's size, checked first)",
            )
        if name == "keys":
            keys_sub = p.add_subparsers(dest="keys_command", required=True)
            add = keys_sub.add_parser("add", help="trust a server's verify key")
            add.add_argument("server", help="server name, e.g. example.org")
            add.add_argument("key_id", help="key ID, e.g. ed25519:a_AbCd")
            add.add_argument("key", help="the verify key, base64")
            imp = keys_sub.add_parser("import", help="trust every key in a keys file")
            imp.add_argument("file", help="JSON: {server: {key ID: base64 key}}")
            keys_sub.add_parser("list", help="show the keys events are checked with")
        if name == "gen-cert":
            p.add_argument("--server-name", help="(default: the configured server_name)")
            p.add_argument("--cert", help="certificate file (default: DATA_DIR/NAME.tls.crt)")
            p.add_argument("--key", help="private key file (default: DATA_DIR/NAME.tls.key)")
            p.add_argument("--days", type=_positive_int, default=365, help="validity")
            p.add_argument("--force", action="store_true", help="replace existing files")
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
        command, _ = COMMANDS[args.command]
        return asyncio.run(command(config, args))
    except ConfigError as exc:
        # Also raised at start-up, for a configured port already in use.
        for problem in exc.problems:
            print(f"configuration error: {problem}", file=sys.stderr)
        return 2
    except DatabaseUnavailableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
