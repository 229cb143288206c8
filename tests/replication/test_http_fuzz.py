"""Fuzzing the internal HTTP API of real processes: no input ever gets a 500.

Two events writers (``w1``, ``w2``) run as separate processes (with a configured shared
secret, and again with the same secret in the data directory's generated-secret file, as
a first start would leave it); a third configured writer (``w3``) never runs, so requests for its
rooms exercise the "owner is down" path. Hypothesis sends random methods, paths (real
routes with random segments, and junk), query strings, bodies (bytes, JSON, and
well-shaped ``send_event`` / ``create_room`` / forwarded client-write bodies with random
fields) with the right, a
wrong, or no bearer token, to either process.

Invariants checked on every request: the status is never 500 (503 only for ``w3``'s
rooms), every error is a Matrix JSON body. Afterwards both processes still serve (health
and a real send on each), neither logged a traceback, and each logged ``w3``'s outage at
most once.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import orjson
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roomstream.replication.http import PREFIX
from roomstream.replication.secret import SECRET_FILE
from roomstream.replication.sharding import writer_for_room
from roomstream.storage import DatabaseConfig
from tests.support.ports import free_port

pytestmark = pytest.mark.postgres

SECRET = "fuzz-secret"
WRITERS = ["w1", "w2", "w3"]
SERVER_NAME = "fuzz.test"
ALICE = f"@alice:{SERVER_NAME}"


@pytest.fixture
def engine_name() -> str:
    return "postgres"  # two writer processes on one database


class Instance:
    def __init__(self, name: str, config_path: Path, log: Path, port: int) -> None:
        self.name = name
        self.log = log
        self.port = port
        with open(log, "ab") as out:
            self.popen = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "roomstream.cli",
                    "-c",
                    str(config_path),
                    "run",
                    "--instance",
                    name,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "CI": ""},
            )
        deadline = time.monotonic() + 60
        # Serving HTTP: "ready", or "started, replication degraded" while a peer writer is
        # down (w3 never starts, and w2 starts after w1).
        while not any(
            f"instance {name} {state}" in self.log_text()
            for state in ("ready", "started, replication degraded")
        ):
            if self.popen.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{name} did not start:\n{self.log_text()}")
            time.sleep(0.05)  # polling a log file for readiness, bounded by the deadline

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, str, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, resp.getheader("Content-Type") or "", resp.read()
        finally:
            conn.close()

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)


AUTH = {"Authorization": f"Bearer {SECRET}"}


@pytest.fixture(params=["configured", "generated"])
def instances(
    db_config: DatabaseConfig, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[dict[str, Any]]:
    secret = SECRET if request.param == "configured" else None
    if secret is None:  # what the first start generates, with a value the test knows
        (tmp_path / "data").mkdir()
        secret_file = tmp_path / "data" / SECRET_FILE
        secret_file.write_text(SECRET + "\n")
        secret_file.chmod(0o600)
    ports = {name: (free_port(), free_port()) for name in WRITERS}
    config = {
        "server_name": SERVER_NAME,
        "data_dir": str(tmp_path / "data"),
        "database": {k: v for k, v in asdict(db_config).items() if k != "options"},
        "stream_writers": {"events": WRITERS, "typing": ["w1"]},
        "instances": {
            name: {"replication_port": rep, "internal_port": web}
            for name, (rep, web) in ports.items()
        },
        "replication": {"transport": "tcp", "shared_secret": secret},
    }
    path = tmp_path / "roomstream.yaml"
    path.write_text(yaml.safe_dump(config))
    started: dict[str, Instance] = {}
    try:
        for name in ("w1", "w2"):  # one after the other: migrations run on the first
            started[name] = Instance(name, path, tmp_path / f"{name}.log", ports[name][1])
        # Rooms owned by each writer, chosen by their shard (room IDs are random).
        rooms: dict[str, str] = {}
        for i in range(200):
            status, _, raw = started["w1"].request(
                "POST",
                f"{PREFIX}/create_room",
                orjson.dumps({"creator": ALICE, "name": f"r{i}"}),
                AUTH,
            )
            assert status == 200, raw
            room = orjson.loads(raw)["room_id"]
            rooms.setdefault(writer_for_room(room, WRITERS), room)
            if len(rooms) == len(WRITERS):
                break
        assert len(rooms) == len(WRITERS), rooms
        yield {"instances": started, "rooms": rooms, "secret": secret}
    finally:
        for instance in started.values():
            instance.stop()


# -- strategies ---------------------------------------------------------------------------

TEXT = st.text(max_size=40)
JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT
)
JSON = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)
STANDARD_METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS")
METHODS = st.sampled_from(STANDARD_METHODS) | (st.from_regex(r"[A-Z]{1,12}", fullmatch=True))
SEGMENT = st.text(min_size=1, max_size=30).map(lambda s: quote(s, safe=""))


#: The forwarded Client-Server API writes (``/client/...``).
CLIENT_WRITES = ("create_room", "account_data", "receipt", "to_device", "typing", "e2e_keys")
CREATE_ROOM_KEYS = (
    "preset",
    "visibility",
    "name",
    "topic",
    "invite",
    "initial_state",
    "room_version",
    "power_level_content_override",
    "room_alias_name",
    "is_direct",
)


@st.composite
def paths(draw: st.DrawFn, rooms: list[str]) -> str:
    room = draw(
        st.sampled_from(rooms)
        | st.sampled_from(["!", "!x", "!nosuchroom:fuzz.test", "nonsense", "%21%00"])
        | SEGMENT.map(lambda s: "!" + s)
    )
    stream = draw(st.sampled_from(["typing", "events", "caches", "nosuch"]) | SEGMENT)
    path = draw(
        st.sampled_from(
            [
                f"{PREFIX}/health",
                f"{PREFIX}/create_room",
                f"{PREFIX}/rooms/{quote(room, safe='!:')}/send_event",
                f"{PREFIX}/streams/{stream}/updates",
                f"{PREFIX}/rooms/{quote(room, safe='!:')}",
                *(f"{PREFIX}/client/{action}" for action in CLIENT_WRITES),
            ]
        )
        | st.lists(SEGMENT, max_size=4).map(lambda parts: PREFIX + "/" + "/".join(parts))
        | st.lists(SEGMENT, max_size=4).map(lambda parts: "/" + "/".join(parts))
    )
    params = draw(
        st.dictionaries(
            st.sampled_from(["from", "upto", "limit", "writer", "x"]),
            st.integers(min_value=-(2**70), max_value=2**70).map(str) | TEXT,
            max_size=4,
        )
    )
    return path + ("?" + urlencode(params) if params else "")


@st.composite
def bodies(draw: st.DrawFn) -> bytes | None:
    sender = st.sampled_from([ALICE, "@eve:elsewhere", ""]) | TEXT | JSON
    event_type = st.sampled_from(["m.room.message", "m.room.create", "m.room.topic"]) | TEXT
    shaped = st.fixed_dictionaries(
        {"sender": sender, "type": event_type},
        optional={
            "content": st.dictionaries(TEXT, JSON, max_size=4) | JSON,
            "state_key": st.just("") | TEXT | JSON,
            "creator": sender,
            "name": TEXT | JSON,
            "redacts": st.just("$e") | TEXT | JSON,
            # the forwarded client writes
            "request": st.dictionaries(
                st.sampled_from(CREATE_ROOM_KEYS),
                st.sampled_from(["10", "11", "12", "99", "public_chat", "private_chat"]) | JSON,
                max_size=4,
            )
            | JSON,
            "user_id": sender,
            "room_id": st.just("!r:fuzz.test") | TEXT | JSON,
            "event_id": st.just("$e") | TEXT | JSON,
            "receipt_type": st.just("m.read") | TEXT | JSON,
            "thread_id": TEXT | JSON,
            "typing": st.booleans() | JSON,
            "timeout": st.integers(min_value=-(2**70), max_value=2**70) | JSON,
            "messages": st.dictionaries(
                sender.filter(lambda s: isinstance(s, str)),
                st.dictionaries(TEXT, st.dictionaries(TEXT, JSON, max_size=2) | JSON, max_size=2)
                | JSON,
                max_size=2,
            )
            | JSON,
        },
    )
    kind = draw(st.sampled_from(["none", "bytes", "json", "shaped"]))
    if kind == "none":
        return None
    if kind == "bytes":
        return draw(st.binary(max_size=300))
    value = draw(JSON if kind == "json" else shaped)
    return json.dumps(value).encode()


HEADERS = st.sampled_from(
    [
        AUTH,
        AUTH,
        AUTH,  # mostly authorised, so requests reach the handlers
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": SECRET},
        {"Authorization": "Bearer "},
    ]
)


def test_no_input_gets_a_500_and_the_processes_keep_serving(instances: dict[str, Any]) -> None:
    started: dict[str, Instance] = instances["instances"]
    rooms: dict[str, str] = instances["rooms"]
    seen: dict[int, int] = {}

    @settings(
        max_examples=400,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(
        target=st.sampled_from(["w1", "w2"]),
        method=METHODS,
        path=paths(list(rooms.values())),
        body=bodies(),
        headers=HEADERS,
        well_formed=st.none()
        | st.tuples(
            st.sampled_from(WRITERS),
            st.sampled_from(["m.room.message", "m.room.topic", "m.room.create", "x"]) | TEXT,
            st.none() | st.sampled_from(["", "\x00", "a\x00b", "\x01"]) | TEXT,
            st.dictionaries(TEXT, JSON, max_size=3),
        ),
    )
    def one_request(
        target: str,
        method: str,
        path: str,
        body: bytes | None,
        headers: dict[str, str],
        well_formed: tuple[str, str, str | None, dict[str, Any]] | None,
    ) -> None:
        if well_formed is not None:  # a send_event that reaches deep: real room, real user
            owner, event_type, state_key, content = well_formed
            method, headers = "POST", AUTH
            path = f"{PREFIX}/rooms/{rooms[owner]}/send_event"
            doc: dict[str, Any] = {"sender": ALICE, "type": event_type, "content": content}
            if state_key is not None:
                doc["state_key"] = state_key
            body = json.dumps(doc).encode()
        status, content_type, raw = started[target].request(method, path, body, headers)
        seen[status] = seen.get(status, 0) + 1
        assert status != 500, raw
        if status >= 500:
            # w3's rooms are down; so is a new room that lands on w3 (its initial state).
            down = rooms["w3"] in path or path.startswith(f"{PREFIX}/client/create_room")
            assert status == 503 and down, (status, path, raw)
        if status >= 400 and method in STANDARD_METHODS and method != "HEAD":
            # (aiohttp's HTTP parser refuses methods it does not know, such as "A", with a
            # plain-text 400 before any roomstream code runs: those are only held to
            # "never a 500".)
            assert content_type.startswith("application/json"), (status, raw)
            assert isinstance(orjson.loads(raw).get("errcode"), str), raw

    one_request()

    # Still serving: health, and a real event through each writer.
    for name, instance in started.items():
        assert instance.popen.poll() is None, instance.log_text()
        status, _, raw = instance.request("GET", f"{PREFIX}/health", None, AUTH)
        assert status == 200, raw
        for owner in ("w1", "w2"):
            body = {"sender": ALICE, "type": "m.room.message", "content": {"body": name}}
            status, _, raw = instance.request(
                "POST", f"{PREFIX}/rooms/{rooms[owner]}/send_event", orjson.dumps(body), AUTH
            )
            assert status == 200, raw
        log = instance.log_text()
        assert "Traceback" not in log, log
        assert log.count("w3 is unreachable") <= 1, log
    reached = {200, 401, 404, 503}
    assert reached <= set(seen), seen  # the fuzzer reached every path
