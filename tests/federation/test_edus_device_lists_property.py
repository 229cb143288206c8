"""Remote device lists against a naive model: any sequence of ``m.device_list_update``s
(repeats, old ones, gaps in ``prev_id``, deletions, keys that do or do not verify)
leaves the cache as the model says (tracked stream_id, stale or not, the devices and
their keys), and writes a ``device_lists`` row exactly for the updates not ignored.
SQLite and PostgreSQL, one engine opened per test, a fresh user per example."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roomstream.e2e.device_lists import changed_users_txn
from roomstream.federation.remote_devices import DeviceListUpdate, RemoteDeviceLists
from roomstream.homeserver import open_room_engine
from roomstream.rooms.engine import RoomEngine
from roomstream.storage import DatabaseConfig, Transaction
from tests.support.e2e_keys import Device
from tests.support.homeserver import make_config

DEVICES = ["PHONE", "LAPTOP", "TABLET"]


@dataclass
class Model:
    stream_id: int
    stale: bool
    devices: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Step:
    device: str
    stream_id: int
    prev_ids: tuple[int, ...]
    deleted: bool
    keys: str  # "none", "good", "bad"


def apply_model(model: Model | None, step: Step, good: dict[str, Any]) -> tuple[Model | None, bool]:
    """The rules of ``RemoteDeviceLists.apply_update``, stated plainly."""
    if model is not None and step.stream_id <= model.stream_id:
        return model, False
    if model is None:
        follows = not step.prev_ids
    else:
        follows = not model.stale and all(p == model.stream_id for p in step.prev_ids)
    if not follows or step.keys == "bad":
        return Model(step.stream_id, True, {}), True
    devices = dict(model.devices) if model is not None else {}
    if step.deleted:
        devices.pop(step.device, None)
    else:
        devices[step.device] = good[step.device] if step.keys == "good" else None
    return Model(step.stream_id, False, devices), True


steps = st.lists(
    st.builds(
        Step,
        st.sampled_from(DEVICES),
        st.integers(min_value=1, max_value=12),
        st.lists(st.integers(min_value=1, max_value=12), max_size=2).map(tuple),
        st.booleans(),
        st.sampled_from(["none", "good", "good", "bad"]),
    ),
    min_size=1,
    max_size=10,
)


LoopAndEngine = tuple[asyncio.AbstractEventLoop, RoomEngine]


@pytest.fixture
def engine(db_config: DatabaseConfig, tmp_path: Path) -> Iterator[LoopAndEngine]:
    loop = asyncio.new_event_loop()
    opened = loop.run_until_complete(open_room_engine(make_config(db_config, tmp_path)))
    try:
        yield loop, opened
    finally:
        loop.run_until_complete(opened.close())
        loop.close()


def test_device_list_updates_follow_the_model(engine: LoopAndEngine) -> None:
    loop, room_engine = engine
    lists = RemoteDeviceLists(
        room_engine.db,
        room_engine.streams.generator("device_lists"),
        joined=lambda t, user: True,
    )
    users = (f"@u{n}:remote.test" for n in itertools.count())

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(sequence=steps)
    def run(sequence: list[Step]) -> None:
        user = next(users)
        good = {d: Device(user, d).device_keys() for d in DEVICES}
        model: Model | None = None
        for step in sequence:
            keys = {"none": None, "good": good[step.device], "bad": {**good[step.device], "x": 1}}
            update = DeviceListUpdate(
                user, step.device, step.stream_id, step.prev_ids, step.deleted, keys[step.keys]
            )
            before = lists.stream.get_linear_position()
            taken = loop.run_until_complete(lists.apply_update(update))
            model, expected = apply_model(model, step, good)
            assert taken == expected, (step, model)
            after = lists.stream.get_linear_position()

            def rows(t: Transaction, since: int = before, upto: int = after) -> set[str]:
                return changed_users_txn(t, since, upto)

            changed = loop.run_until_complete(room_engine.db.run_interaction("rows", rows))
            assert (user in changed) == expected
            cached = loop.run_until_complete(lists.get(user))
            if model is None:
                assert cached is None
                continue
            assert cached is not None
            assert (cached.stream_id, cached.stale) == (model.stream_id, model.stale)
            assert cached.devices == model.devices

    run()
