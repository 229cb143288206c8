"""The internal API is never served on the client listener and always wants the secret.

With the default configuration's shape (loopback, no ``replication.shared_secret``), every
route of the internal application (enumerated from its router, not listed by hand):

- answers 404 ``M_UNRECOGNIZED`` on the client port (``http_port``), with or without the
  secret;
- answers 401 ``M_UNAUTHORIZED`` on the internal port without the secret, or with a
  wrong one;
- reaches its handler on the internal port with the generated secret;

on one process and on several (an events writer and a reader). The TCP replication port
wants the same secret. The generated secret file is created once, mode 0600, reused on
restart and shared by every process of the deployment, also when they start at once.
"""

from __future__ import annotations

import asyncio
import io
import multiprocessing
import os
import re
import stat
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from rich.console import Console

from roomstream.config import Config, ConfigError, is_loopback, parse_config
from roomstream.demo import run_with_demo_traffic
from roomstream.homeserver import Homeserver
from roomstream.replication import endpoints as ep
from roomstream.replication.http import PREFIX
from roomstream.replication.secret import (
    SECRET_FILE,
    effective_shared_secret,
    load_or_create_secret,
    secret_path,
)
from roomstream.storage import DatabaseConfig
from tests.support.ports import free_port
from tests.support.replication import (
    Cluster,
    ClusterFactory,
    Raw,
)
from tests.support.wait import wait_for

WORKER = (sys.executable, "-m", "roomstream.cli")
#: Values for the path parameters of internal routes.
SAMPLE_PARAMETERS = {"room_id": "!nowhere:internal.test", "stream": "typing"}


def internal_routes(app: web.Application) -> list[tuple[str, str]]:
    """(method, concrete path) of every route of an internal application, from its
    router; a route template's parameters get sample values."""
    routes = []
    for resource in app.router.resources():
        path = re.sub(r"\{(\w+)\}", lambda m: SAMPLE_PARAMETERS[m.group(1)], resource.canonical)
        routes.extend((route.method, path) for route in resource)
    return routes


def default_shaped_config(db_config: DatabaseConfig, tmp_path: Path) -> Config:
    """The default configuration (no file) on the test's database and data directory, with
    free ports in place of 8008/9093/9092 so that parallel runs do not collide."""
    database = {k: v for k, v in asdict(db_config).items() if k != "options"}
    config = parse_config({"data_dir": str(tmp_path / "data"), "database": database})
    main = config.instances["main"]
    assert (main.http_port, main.internal_port, main.replication_port) == (8008, 9093, 9092)
    assert is_loopback(main.host) and config.replication.shared_secret is None
    ports = {"http_port": free_port(), "internal_port": free_port()}
    return replace(
        config,
        instances={"main": replace(main, replication_port=free_port(), **ports)},
    )


async def assert_internal_api_guarded(server: Homeserver, secret: str) -> None:
    """The three rules of the module docstring, for every internal route of ``server``."""
    assert server.internal is not None and server.internal.port is not None
    assert server.client_http is not None and server.client_http.port is not None
    routes = internal_routes(server.internal.app)
    paths = {path for _, path in routes}
    assert "/metrics" in paths and f"{PREFIX}/health" in paths
    assert f"{PREFIX}/client/end_sessions" in paths  # the forwarded client writes too
    good = {"Authorization": f"Bearer {secret}"}
    client_url = f"http://127.0.0.1:{server.client_http.port}"
    internal_url = f"http://127.0.0.1:{server.internal.port}"
    async with aiohttp.ClientSession() as http:
        for method, path in routes:
            for headers in ({}, good):
                async with http.request(method, client_url + path, headers=headers) as resp:
                    assert resp.status == 404, (method, path, resp.status)
                    if method != "HEAD":
                        body = await resp.json()
                        assert body["errcode"] == "M_UNRECOGNIZED", (method, path, body)
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": secret}):
                async with http.request(method, internal_url + path, headers=headers) as resp:
                    assert resp.status == 401, (method, path, headers, resp.status)
                    if method != "HEAD":
                        body = await resp.json()
                        assert body["errcode"] == "M_UNAUTHORIZED", (method, path, body)
            async with http.request(method, internal_url + path, headers=good) as resp:
                # Past the guard: the handler answers (a refusal of the empty body, or
                # "no such rows here"), never "who are you" or "no such route".
                assert resp.status not in (401, 405), (method, path, resp.status)
                if method != "HEAD" and resp.status == 404:
                    body = await resp.json()
                    assert body["errcode"] != "M_UNRECOGNIZED", (method, path, body)
        async with http.get(f"{internal_url}{PREFIX}/health", headers=good) as resp:
            assert resp.status == 200
            assert (await resp.json())["instance"] == server.config.instance_name
        async with http.get(f"{internal_url}/metrics", headers=good) as resp:
            assert resp.status == 200
            assert "roomstream_stream_position" in await resp.text()
        # The client API itself is on the client port, not on the internal one.
        async with http.get(f"{client_url}/_matrix/client/versions") as resp:
            assert resp.status == 200
        async with http.get(f"{internal_url}/_matrix/client/versions", headers=good) as resp:
            assert resp.status == 404


async def test_one_process_with_the_default_configuration(
    db_config: DatabaseConfig, tmp_path: Path
) -> None:
    config = default_shaped_config(db_config, tmp_path)
    cluster = Cluster(config, tmp_path)
    node = await cluster.start("main")
    try:
        secret = (tmp_path / "data" / SECRET_FILE).read_text().strip()
        assert len(secret) >= 43  # 256 bits, URL-safe base64
        assert node.settings.shared_secret == secret  # TCP replication uses it too
        await assert_internal_api_guarded(cluster.servers["main"], secret)
        # The demo's traffic goes through the internal API, with the same secret.
        alice = f"@alice:{config.server_name}"
        http_client = node.http_client
        call = ep.CreateNamedRoomCall(alice, "demo")
        room = await http_client.call(ep.CREATE_NAMED_ROOM, "main", call)
        message = ep.SendEventCall(room, alice, "m.room.message", {"body": "hi"})
        sent = await http_client.call(ep.SEND_EVENT, http_client.room_owner(room), message)
        assert sent["event_id"].startswith("$")
    finally:
        await cluster.close()


#: Several processes on one database: the multi-process engine.
several_processes = pytest.mark.parametrize("engine_name", ["postgres"])


@several_processes
async def test_several_processes_and_tcp_replication_use_the_generated_secret(
    cluster_factory: ClusterFactory,
    tmp_path: Path,
) -> None:
    instances = {
        name: {
            "replication_port": free_port(),
            "http_port": free_port(),
            "internal_port": free_port(),
        }
        for name in ("w1", "w2", "reader")
    }
    cluster = await cluster_factory(
        "tcp",
        stream_writers={"events": ["w1", "w2"], "caches": ["w1"], "typing": ["w2"]},
        instances=instances,
    )
    assert cluster.config.replication.shared_secret is None
    nodes = [await cluster.start(name) for name in ("w1", "w2", "reader")]
    secret = (tmp_path / "data" / SECRET_FILE).read_text().strip()
    assert {node.settings.shared_secret for node in nodes} == {secret}
    await asyncio.wait_for(asyncio.gather(*(node.replicating() for node in nodes)), 60)
    for name in ("w1", "w2", "reader"):
        await assert_internal_api_guarded(cluster.servers[name], secret)
    # A replication connection without the secret is refused before anything is said.
    w1 = nodes[0]
    assert w1.server is not None
    raw = await Raw.connect(w1.server.port)
    try:
        await raw.send(b"REPLICATE\n")
        assert (await raw.until("ERROR")) == (
            "ERROR authentication required: send AUTH <secret> first"
        )
        await raw.eof()
    finally:
        raw.close()
    # Writes forwarded between the processes (reader -> owner) carry it.
    reader = nodes[2]
    alice = f"@alice:{cluster.config.server_name}"
    http_client = reader.http_client
    create = ep.CreateNamedRoomCall(alice, "forwarded")
    room = await http_client.call(ep.CREATE_NAMED_ROOM, "w1", create)
    message = ep.SendEventCall(room, alice, "m.room.message", {"body": "hi"})
    await http_client.call(ep.SEND_EVENT, http_client.room_owner(room), message)
    await wait_for(
        lambda: (
            reader.engine.streams.generator("events").get_linear_position()
            >= w1.engine.streams.generator("events").get_linear_position()
        ),
        what="the reader catching up",
    )


# -- the generated secret -----------------------------------------------------------------


def test_the_secret_is_created_once_mode_0600_and_reused(tmp_path: Path) -> None:
    path = tmp_path / "data" / SECRET_FILE  # data_dir does not exist yet
    first = load_or_create_secret(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    inode = path.stat().st_ino
    assert load_or_create_secret(path) == first  # a restart
    assert path.stat().st_ino == inode
    assert [p.name for p in path.parent.iterdir()] == [SECRET_FILE]  # no temporary left
    assert load_or_create_secret(tmp_path / "other" / SECRET_FILE) != first
    # A configured secret wins, and the file is not even created.
    configured = parse_config(
        {"data_dir": str(tmp_path / "d2"), "replication": {"shared_secret": "mine"}}
    )
    assert effective_shared_secret(configured) == "mine"
    assert not secret_path(configured).exists()


def test_an_unusable_secret_file_is_one_configuration_error(tmp_path: Path) -> None:
    path = tmp_path / SECRET_FILE
    path.write_text("\n")
    with pytest.raises(ConfigError, match="not a replication secret"):
        load_or_create_secret(path)
    blocked = tmp_path / "file"
    blocked.write_text("x")
    with pytest.raises(ConfigError, match=r"replication secret .*file/replication_secret"):
        load_or_create_secret(blocked / SECRET_FILE)


def _create_at_once(path: str, barrier: Any, out: Any) -> None:
    barrier.wait()
    out.put(load_or_create_secret(Path(path)))


def test_processes_starting_at_once_agree_on_one_secret(tmp_path: Path) -> None:
    """Eight processes create the secret at the same moment, ten times over: each time all
    of them read the same complete secret, and the file is whole and 0600."""
    context = multiprocessing.get_context("fork")
    for round_ in range(10):
        path = tmp_path / f"round{round_}" / SECRET_FILE
        barrier, out = context.Barrier(8), context.Queue()
        workers = [
            context.Process(target=_create_at_once, args=(str(path), barrier, out))
            for _ in range(8)
        ]
        for worker in workers:
            worker.start()
        seen = {out.get(timeout=60) for _ in workers}
        for worker in workers:
            worker.join(60)
            assert worker.exitcode == 0
        assert seen == {path.read_text().strip()}
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert os.listdir(path.parent) == [SECRET_FILE]


@several_processes
def test_two_real_processes_of_one_deployment_share_the_generated_secret(
    db_config: DatabaseConfig, tmp_path: Path
) -> None:
    """Two worker processes started together, no secret configured: each accepts the one
    file's secret on its internal port (and refuses a request without it)."""
    ports = {name: free_port() for name in ("w1", "reader")}
    raw = {
        "server_name": "shared.test",
        "data_dir": str(tmp_path / "data"),
        "database": {k: v for k, v in asdict(db_config).items() if k != "options"},
        "stream_writers": {"events": ["w1"]},
        "instances": {
            name: {"replication_port": free_port(), "internal_port": port}
            for name, port in ports.items()
        },
    }
    config_path = tmp_path / "roomstream.yaml"
    config_path.write_text(yaml.safe_dump(raw))
    logs = {name: tmp_path / f"{name}.log" for name in ports}
    procs = []
    for name, log in logs.items():
        with open(log, "wb") as out:
            procs.append(
                subprocess.Popen(
                    [*WORKER, "-c", str(config_path), "run", "--instance", name],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )

    async def check() -> None:
        async def health(port: int, headers: dict[str, str]) -> int:
            url = f"http://127.0.0.1:{port}{PREFIX}/health"
            async with aiohttp.ClientSession() as http, http.get(url, headers=headers) as r:
                return r.status

        loop = asyncio.get_running_loop()
        deadline = loop.time() + 120
        for name, port in ports.items():
            while f"instance {name} " not in logs[name].read_text(errors="replace"):
                assert all(p.poll() is None for p in procs), logs[name].read_text()
                assert loop.time() < deadline, logs[name].read_text()
                await asyncio.sleep(0.05)  # polling a log file for start-up, bounded
            secret = (tmp_path / "data" / SECRET_FILE).read_text().strip()
            assert await health(port, {"Authorization": f"Bearer {secret}"}) == 200
            assert await health(port, {}) == 401

    try:
        asyncio.run(check())
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)
    assert [p.name for p in (tmp_path / "data").iterdir() if "secret" in p.name] == [SECRET_FILE]


# -- configuration ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ({"instances": {"w": {"internal_port": "x"}}}, "instances.w.internal_port must be an"),
        ({"instances": {"w": {"internal_port": 0}}}, "instances.w.internal_port must be a port"),
        (
            {"instances": {"w": {"http_port": 9000, "internal_port": 9000}}},
            "instances.w.internal_port: port 9000 on 127.0.0.1 is also instances.w.http_port",
        ),
    ],
)
def test_internal_port_is_checked_like_the_other_ports(raw: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(raw)
    assert [p for p in caught.value.problems if p.startswith(problem)], caught.value.problems


async def test_the_demo_needs_an_internal_port(tmp_path: Path) -> None:
    config = parse_config(
        {"data_dir": str(tmp_path), "instances": {"main": {"http_port": free_port()}}}
    )
    with pytest.raises(ConfigError, match=r"instances.main.internal_port: --demo"):
        await run_with_demo_traffic(config, Console(file=io.StringIO()))
