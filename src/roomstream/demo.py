"""The demo of ``roomstream run --once`` and ``roomstream run --demo``: a room and a few
messages, shown as the events stream carries them."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aiohttp
import orjson
from rich.console import Console

from roomstream.config import Config, ConfigError
from roomstream.errors import ServiceUnavailableError
from roomstream.events.types import EventTypes
from roomstream.homeserver import open_room_engine, run_instance
from roomstream.replication import endpoints as ep
from roomstream.replication.http import InternalHttpClient
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
                room_id, alice, EventTypes.MESSAGE, {"msgtype": "m.text", "body": body}
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
    from roomstream.replication.secret import secret_path

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
                await client.call(ep.HEALTH, config.instance_name, ep.HealthCall())
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
        room_id = await client.call(
            ep.CREATE_NAMED_ROOM,
            config.instance_name,
            ep.CreateNamedRoomCall(alice, "roomstream demo"),
        )
        count = 0
        while not instance.done():
            count += 1
            message = {"msgtype": "m.text", "body": f"tick {count}"}
            call = ep.SendEventCall(room_id, alice, EventTypes.MESSAGE, message)
            await client.call(ep.SEND_EVENT, client.room_owner(room_id), call)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(instance), 2.0)
        return instance.result()
    finally:
        stop.set()
        await client.close()
        if not instance.done():
            await instance
