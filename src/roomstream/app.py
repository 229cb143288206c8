"""What ``roomstream run`` does for an instance."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import aiohttp
import orjson
from rich.console import Console

from roomstream.config import Config, ConfigError
from roomstream.errors import ServiceUnavailableError
from roomstream.homeserver import open_room_engine
from roomstream.rooms.creation import RoomPreset

logger = logging.getLogger(__name__)


async def run_demo(config: Config, console: Console) -> int:
    """Create a room, send a few events, and show them as the events stream carries them."""
    engine = await open_room_engine(config)
    try:
        where = config.database.path if config.database.engine == "sqlite" else config.database.dsn
        console.print(
            f"[bold]roomstream[/bold] instance {config.instance_name!r} on "
            f"{config.database.engine} ({where})"
        )
        events = engine.streams.generator("events")
        before = events.get_position(config.instance_name)
        alice = f"@alice:{config.server_name}"
        room_id, _ = await engine.creator.create_room(
            alice, preset=RoomPreset.PUBLIC_CHAT, name="roomstream demo"
        )
        for body in ("hello", "this is roomstream"):
            await engine.creator.create_event(
                room_id, alice, "m.room.message", {"msgtype": "m.text", "body": body}
            )
        after = events.get_position(config.instance_name)
        updates, _, _ = await engine.streams.get_updates(
            "events", config.instance_name, before, after, 1000
        )
        for token, row in updates:
            line = f"RDATA events {config.instance_name} {token} {orjson.dumps(row).decode()}"
            console.print(line, markup=False, highlight=False, soft_wrap=True)
        state = await engine.store.get_current_state(room_id)
        console.print(
            f"room {room_id}: {len(state)} state entries; events stream {before} -> {after}"
        )
    finally:
        await engine.close()
    return 0


async def run_with_demo_traffic(config: Config, console: Console) -> int:
    """Run the instance and, through its own internal HTTP API, create a room and send a
    message every 2 seconds, so a person watching the replication port sees RDATA."""
    from roomstream.replication.http import InternalHttpClient
    from roomstream.replication.secret import secret_path
    from roomstream.replication.worker import run_instance

    me = config.instance()
    if me.internal_port is None:
        raise ConfigError(
            f"instances.{config.instance_name}.internal_port: --demo sends its traffic"
            " through the internal API, which needs one"
        )
    stop = asyncio.Event()
    instance = asyncio.create_task(run_instance(config, console, stop=stop))
    client = InternalHttpClient(config)
    try:
        while True:  # readiness: the health endpoint answers
            if instance.done():
                return instance.result()
            try:
                await client.health(config.instance_name)
                break
            except (OSError, aiohttp.ClientError, ServiceUnavailableError):
                await asyncio.sleep(0.1)  # polling a server that is starting
        # The replication port wants the deployment's secret first (AUTH); the command
        # reads it from its file rather than printing the secret itself.
        auth = (
            "AUTH <replication.shared_secret>"
            if config.replication.shared_secret
            else f"AUTH $(cat {secret_path(config)})"
        )
        console.print(
            f'watch the events stream: (echo "{auth}"; cat) | nc 127.0.0.1 '
            f"{me.replication_port}  (Ctrl-C stops)",
            markup=False,
            highlight=False,
        )
        alice = f"@alice:{config.server_name}"
        room_id = await client.create_room(config.instance_name, alice, "roomstream demo")
        count = 0
        while not instance.done():
            count += 1
            await client.send_event(
                room_id, alice, "m.room.message", {"msgtype": "m.text", "body": f"tick {count}"}
            )
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(instance), 2.0)
        return instance.result()
    finally:
        stop.set()
        await client.close()
        if not instance.done():
            await instance


class ViewsJob:
    """The views streaming job (``roomstream views --follow``) in a child process beside
    the server, against the same database: it keeps the tables behind ``/publicRooms`` and
    ``/user_directory/search`` current (staleness: its 1 s trigger plus a batch's time).

    A child process, not a thread: Spark's JVM and its failures stay out of the server.
    If the job cannot start or dies, the server keeps serving (the directory as last
    written) and one WARNING line says so, naming the job's log file.
    """

    def __init__(self, command: Sequence[str], log_path: Path) -> None:
        self.command = list(command)
        self.log_path = log_path
        self.process: asyncio.subprocess.Process | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._stopping = False
        self.stop_timeout = 30.0

    @classmethod
    def for_config(cls, config: Config, config_path: str | None) -> ViewsJob:
        where = ["-c", config_path] if config_path else []
        return cls(
            [sys.executable, "-m", "roomstream.cli", *where, "views", "--follow"],
            Path(config.data_dir) / "views-job.log",
        )

    async def start(self) -> None:
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("ab") as log:
                self.process = await asyncio.create_subprocess_exec(
                    *self.command,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log,
                    stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True,  # stopped by us, not by the terminal's Ctrl-C
                )
        except OSError as exc:
            logger.warning(
                "views job not started (%s): /publicRooms and /user_directory/search will"
                " not be updated",
                exc,
            )
            return
        logger.info("views job started (pid %d, log %s)", self.process.pid, self.log_path)
        self._watcher = asyncio.create_task(self._watch(self.process))

    async def _watch(self, process: asyncio.subprocess.Process) -> None:
        code = await process.wait()
        if not self._stopping:
            logger.warning(
                "views job exited with code %s: /publicRooms and /user_directory/search are"
                " no longer updated (the server keeps serving; see %s)",
                code,
                self.log_path,
            )

    async def stop(self) -> None:
        """Terminate the job and wait for it (its JVM exits with it); kill it if it has not
        exited after :attr:`stop_timeout` seconds. Stopping it anywhere is safe: its sink
        is exactly-once, and the next start continues from the checkpoint."""
        self._stopping = True
        process = self.process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), self.stop_timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
        if self._watcher is not None:
            await self._watcher
