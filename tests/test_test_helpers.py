"""The helpers that keep tests deterministic (``tests/support/sharding.py``,
``tests/support/ports.py``)."""

from __future__ import annotations

import itertools
import socket
from pathlib import Path

import pytest

from roomstream.replication.sharding import writer_for_room
from tests.support.ports import free_port
from tests.support.sharding import room_ids_for_writer, rooms_by_owner

WRITERS = ["w1", "w2", "w3"]


def test_room_ids_for_writer_are_owned_and_the_same_every_time() -> None:
    for writer in WRITERS:
        rooms = room_ids_for_writer(writer, WRITERS, "hs.test", count=5)
        assert len(set(rooms)) == 5
        assert all(writer_for_room(r, WRITERS) == writer for r in rooms)
        assert rooms == room_ids_for_writer(writer, WRITERS, "hs.test", count=5)
    with pytest.raises(ValueError):
        room_ids_for_writer("w9", WRITERS, "hs.test")


async def test_rooms_by_owner_fills_every_writer() -> None:
    made: list[str] = []

    async def create(i: int) -> str:
        made.append(f"!r{i}:hs.test")
        return made[-1]

    owned = await rooms_by_owner(create, WRITERS, 3)
    assert sorted(owned) == WRITERS
    for writer, rooms in owned.items():
        assert len(rooms) == 3 and all(writer_for_room(r, WRITERS) == writer for r in rooms)
        assert rooms == [r for r in made if r in rooms]  # in creation order

    async def one_owner(i: int) -> str:  # never reaches the other writers: a clear failure
        return room_ids_for_writer("w1", WRITERS, "hs.test", count=i + 1)[-1]

    with pytest.raises(AssertionError, match="did not give"):
        await rooms_by_owner(one_owner, WRITERS, 1, max_rooms=5)


def test_free_ports_are_distinct_bindable_and_outside_the_ephemeral_range() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(20)]
    assert len(set(ports)) == 20 and all(p < low for p in ports)
    for port in itertools.islice(ports, 3):
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))


def test_no_module_imports_a_test_module() -> None:
    """Helpers shared by test modules live in tests/support/ (one home): importing a
    test module from another runs its tests' imports and fixtures twice and hides the
    helper where nobody looks for it."""
    import re

    root = Path(__file__).parent
    pattern = re.compile(r"^\s*(from|import)\s+tests(\.\w+)*\.test_\w+", re.M)
    found = [
        str(path.relative_to(root))
        for path in sorted(root.rglob("*.py"))
        if "node_modules" not in path.parts and pattern.search(path.read_text())
    ]
    assert found == []
