"""What ``roomstream run`` does for an instance."""

from __future__ import annotations

import orjson
from rich.console import Console

from roomstream.config import Config
from roomstream.rooms.creation import RoomPreset
from roomstream.rooms.engine import RoomEngine


async def run_demo(config: Config, console: Console) -> int:
    """Create a room, send a few events, and show them as the events stream carries them."""
    engine = await RoomEngine.open(config)
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


async def run_main_job(config: Config, console: Console, once: bool = True) -> int:
    return await run_demo(config, console)
