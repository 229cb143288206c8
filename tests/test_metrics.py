"""Prometheus metrics: the follower's lag bookkeeping, and /metrics of real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from roomstream.config import parse_config
from roomstream.errors import MatrixError
from roomstream.replication import endpoints as ep
from roomstream.replication import follower as follower_module
from roomstream.replication.commands import PositionCommand, RdataCommand
from roomstream.replication.follower import StreamFollower
from roomstream.replication.http import InternalHttpClient
from roomstream.replication.secret import effective_shared_secret
from tests.support.ports import free_port
from tests.support.wait import wait_for

_RUN = [sys.executable, "-m", "roomstream.cli"]


class _Ignore:
    def process(self, stream_name: str, writer: str, token: int, rows: list[Any]) -> None:
        pass

    def advanced(self, stream_name: str, writer: str, token: int) -> None:
        pass


def test_follower_lag_counts_tokens_and_seconds_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(follower_module.time, "monotonic", lambda: now[0])
    follower = StreamFollower(_Ignore(), ["events"], {("events", "w1"): 5}, instance_name="me")
    session = follower.new_session()
    assert session.handle(PositionCommand("events", "w1", 5, 5)) is None
    assert follower.lag() == {("events", "w1"): (0, 0.0)}
    gap = session.handle(PositionCommand("events", "w1", 9, 12))  # 6..12 were missed
    assert gap is not None
    now[0] = 102.5
    assert follower.lag() == {("events", "w1"): (7, 2.5)}
    session.apply_updates(gap, [(8, "row"), (10, "row")])
    now[0] = 103.0
    assert follower.lag() == {("events", "w1"): (2, 3.0)}  # still waiting since 100
    session.advance_to(gap, 12)
    assert follower.lag() == {("events", "w1"): (0, 0.0)}
    # A live row is processed at once: never behind.
    session.handle(RdataCommand("events", "w1", 13, "row"))
    assert follower.lag() == {("events", "w1"): (0, 0.0)}


def _samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def _value(
    samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str
) -> float:
    matches = [
        v for lbl, v in samples.get(name, []) if all(lbl.get(k) == x for k, x in labels.items())
    ]
    assert len(matches) == 1, (name, labels, samples.get(name))
    return matches[0]


@pytest.fixture
def two_instances(tmp_path: Path) -> Iterator[tuple[dict[str, Any], dict[str, Path]]]:
    """An events writer and a reader over TCP, as real processes."""
    raw = {
        "server_name": "metrics.test",
        "data_dir": str(tmp_path / "data"),
        "stream_writers": {"events": ["w1"]},
        "instances": {
            "w1": {
                "replication_port": free_port(),
                "http_port": free_port(),
                "internal_port": free_port(),
            },
            "reader": {"http_port": free_port(), "internal_port": free_port()},
        },
    }
    config = tmp_path / "roomstream.yaml"
    config.write_text(yaml.safe_dump(raw))
    env = {k: v for k, v in os.environ.items() if k != "ROOMSTREAM_CONFIG"}
    logs = {name: tmp_path / f"{name}.log" for name in ("w1", "reader")}
    procs = []
    for name, log in logs.items():
        with open(log, "wb") as out:
            procs.append(
                subprocess.Popen(
                    [*_RUN, "-c", str(config), "run", "--instance", name],
                    cwd=tmp_path,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
    try:
        yield raw, logs
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


async def test_metrics_of_real_instances_after_traffic(
    two_instances: tuple[dict[str, Any], dict[str, Path]],
) -> None:
    raw, logs = two_instances
    config = parse_config(raw)
    client = InternalHttpClient(config, timeout=10)
    # /metrics is on the internal listener, behind the deployment's secret.
    ports = {name: raw["instances"][name]["internal_port"] for name in ("w1", "reader")}
    auth = {"Authorization": f"Bearer {effective_shared_secret(config)}"}

    def logs_text() -> str:
        return "".join(log.read_text(errors="replace") for log in logs.values())

    not_listening_yet = (aiohttp.ClientError, OSError, MatrixError)

    try:
        async with aiohttp.ClientSession(headers=auth) as http:

            async def scrape(name: str) -> dict[str, list[tuple[dict[str, str], float]]]:
                async with http.get(f"http://127.0.0.1:{ports[name]}/metrics") as resp:
                    assert resp.status == 200
                    assert resp.headers["Content-Type"].startswith("text/plain")
                    return _samples(await resp.text())

            async def ready() -> bool:
                for name in ("w1", "reader"):
                    if (await client.call(ep.HEALTH, name, ep.HealthCall()))["status"] != "ok":
                        return False
                return True

            await wait_for(
                ready,
                what="both instances healthy",
                interval=0.05,
                ignoring=not_listening_yet,
                details=logs_text,
            )
            room = await client.call(
                ep.CREATE_NAMED_ROOM, "w1", ep.CreateNamedRoomCall("@alice:metrics.test", "metrics")
            )
            last = 0
            for i in range(5):
                call = ep.SendEventCall(
                    room, "@alice:metrics.test", "m.room.message", {"body": str(i)}
                )
                result = await client.call(ep.SEND_EVENT, client.room_owner(room), call)
                last = int(result["stream_ordering"])
            async with http.get(f"http://127.0.0.1:{ports['w1']}/no/such/thing") as resp:
                assert resp.status == 404
            bad = f"http://127.0.0.1:{ports['w1']}/_roomstream/replication/rooms/{room}/send_event"
            async with http.post(bad, data=b"{not json") as resp:
                assert resp.status == 400

            w1 = await scrape("w1")
            send_route = "/_roomstream/replication/rooms/{room_id}/send_event"
            requests = "roomstream_http_requests_total"
            assert _value(w1, requests, method="POST", route=send_route, status="200") == 5
            assert _value(w1, requests, method="POST", route=send_route, status="400") == 1
            assert _value(w1, requests, route="unmatched", status="404") == 1
            assert (
                _value(
                    w1,
                    requests,
                    method="POST",
                    route="/_roomstream/replication/create_room",
                    status="200",
                )
                == 1
            )
            # Bounded labels: route templates only, never a room ID.
            assert not any(room in str(labels) for labels, _ in w1[requests])
            persisted = "roomstream_events_persisted_total"
            accepted = _value(w1, persisted, room_version="12", outcome="accepted")
            assert accepted >= 6  # the room's creation events and the five messages
            assert _value(w1, "roomstream_persist_seconds_count") >= 6
            assert _value(w1, "roomstream_stream_position", stream="events", writer="w1") == last
            assert _value(w1, "roomstream_stream_linear_position", stream="events") == last
            assert _value(w1, "roomstream_replication_connections", kind="server") == 1

            async def reader_caught_up() -> dict[str, list[tuple[dict[str, str], float]]] | None:
                samples = await scrape("reader")
                linear = _value(samples, "roomstream_stream_linear_position", stream="events")
                return samples if linear == last else None

            reader = await wait_for(
                reader_caught_up,
                what="the reader's linear position",
                interval=0.05,
                ignoring=not_listening_yet,
                details=logs_text,
            )
            assert _value(reader, "roomstream_replication_connections", kind="client") == 1
            assert (
                _value(reader, "roomstream_stream_position", stream="events", writer="w1") == last
            )
            lag = {"stream": "events", "writer": "w1"}
            assert _value(reader, "roomstream_replication_lag_facts", **lag) == 0
            assert _value(reader, "roomstream_replication_lag_seconds", **lag) == 0
    finally:
        await client.close()
