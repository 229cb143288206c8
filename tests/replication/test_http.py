"""The internal HTTP API: in-memory stream updates, routed send_event, errors, bearer auth."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from roomstream.config import DatabaseConfig
from roomstream.errors import ServiceUnavailableError
from roomstream.replication import endpoints as ep
from roomstream.replication.http import PREFIX, InternalHttpClient
from tests.support.ports import free_port
from tests.support.replication import (
    ClusterFactory,
    internal_auth,
    make_config,
    tcp_instances,
)
from tests.support.sharding import room_ids_for_writer, rooms_by_owner


@pytest.fixture
def engine_name() -> str:
    return "postgres"  # two writers persisting events: the multi-process engine


async def test_send_event_is_routed_to_the_owner_and_errors_are_matrix_json(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = await cluster_factory(
        "tcp",
        stream_writers={"events": ["w1", "w2"], "typing": ["w1"]},
        instances=tcp_instances("w1", "w2", http=True),
    )
    w1 = await cluster.start("w1")
    w2 = await cluster.start("w2")
    alice = f"@alice:{cluster.config.server_name}"
    by_owner = await rooms_by_owner(
        lambda i: w1.http_client.call(
            ep.CREATE_NAMED_ROOM, "w1", ep.CreateNamedRoomCall(alice, f"room{i}")
        ),
        ["w1", "w2"],
        3,
    )
    owners = {room: owner for owner, rooms in by_owner.items() for room in rooms}
    rooms = list(owners)
    base = {name: w1.http_client.base_url(name) for name in ("w1", "w2")}
    async with aiohttp.ClientSession(headers=internal_auth(cluster.config)) as http:
        for room, owner in owners.items():
            for entry in ("w1", "w2"):  # either instance accepts it; the owner persists it
                body = {"sender": alice, "type": "m.room.message", "content": {"body": entry}}
                async with http.post(f"{base[entry]}/rooms/{room}/send_event", json=body) as r:
                    assert r.status == 200, await r.text()
                    result = await r.json()
                rows = await w1.engine.db.run_interaction(
                    "test_query",
                    lambda txn, e=result["event_id"]: txn.query(
                        "SELECT instance_name, stream_ordering FROM events WHERE event_id = ?", (e,)
                    ),
                )
                assert rows == [(owner, result["stream_ordering"])]

        async def error(method: str, url: str, **kw: object) -> tuple[int, dict[str, str]]:
            async with http.request(method, url, **kw) as r:  # type: ignore[arg-type]
                return r.status, await r.json()

        room = rooms[0]
        url = f"{base['w1']}/rooms/{room}/send_event"
        status, body = await error("POST", url, data=b"{nope")
        assert (status, body["errcode"]) == (400, "M_NOT_JSON")
        status, body = await error("POST", url, json=[1])
        assert (status, body["errcode"]) == (400, "M_BAD_JSON")
        status, body = await error("POST", url, json={"type": "m.room.message"})
        assert (status, body["errcode"]) == (400, "M_MISSING_PARAM")
        status, body = await error("POST", url, json={"sender": alice, "type": "t", "content": 1})
        assert (status, body["errcode"]) == (400, "M_BAD_JSON")
        status, body = await error("POST", f"{base['w1']}/rooms/nonsense/send_event", json={})
        assert (status, body["errcode"]) == (400, "M_INVALID_PARAM")
        status, body = await error("POST", url, json={"sender": "@eve:other", "type": "t"})
        assert (status, body["errcode"]) == (400, "M_INVALID_PARAM")
        # Each field's fault, answered as the hand-written route of earlier releases did
        # (a sender or type of the wrong JSON type is M_MISSING_PARAM there).
        message = {"sender": alice, "type": "m.room.message", "content": {}}
        for fault, code in (
            ({"sender": 5}, "M_MISSING_PARAM"),
            ({"sender": None}, "M_MISSING_PARAM"),
            ({"sender": "alice"}, "M_INVALID_PARAM"),
            ({"type": ["t"]}, "M_MISSING_PARAM"),
            ({"type": "a\x00"}, "M_INVALID_PARAM"),
            ({"content": None}, "M_BAD_JSON"),  # absent is {}, null is refused
            ({"state_key": 5}, "M_BAD_JSON"),
            ({"state_key": "a\x00b"}, "M_INVALID_PARAM"),
            ({"redacts": 5}, "M_BAD_JSON"),
            ({"redacts": "no-sigil"}, "M_INVALID_PARAM"),
        ):
            status, body = await error("POST", url, json={**message, **fault})
            assert (status, body["errcode"]) == (400, code), fault
        for bad_room in ("!", "%21a%01", "nonsense"):  # the room ID in the path: first
            status, body = await error("POST", f"{base['w2']}/rooms/{bad_room}/send_event")
            assert (status, body["errcode"]) == (400, "M_INVALID_PARAM"), bad_room
        # create_room: the creator is required, creator and name are strings.
        for doc in ({}, {"creator": 5}, {"creator": alice, "name": 5}, {"name": "n"}):
            status, body = await error("POST", f"{base['w1']}/create_room", json=doc)
            assert (status, body["errcode"]) == (400, "M_MISSING_PARAM"), doc
        status, body = await error("POST", f"{base['w1']}/create_room", data=b"[]")
        assert (status, body["errcode"]) == (400, "M_BAD_JSON")
        # health takes no parameters and ignores any given.
        status, body = await error("GET", f"{base['w1']}/health?from=x")
        assert (status, body["instance"], body["status"]) == (200, "w1", "ok")
        status, body = await error("GET", f"{base['w1']}/nowhere")
        assert (status, body["errcode"]) == (404, "M_UNRECOGNIZED")
        status, body = await error("POST", url, data=b"x" * 100_000)
        assert (status, body["errcode"]) == (413, "M_TOO_LARGE")

        # In-memory stream rows, from their writer only.
        for i in range(3):
            w1.append_typing(f"!t{i}:x", [f"@u{i}:x"])
        async with http.get(f"{base['w1']}/streams/typing/updates?writer=w1&from=1&upto=3") as r:
            assert r.status == 200
            assert await r.json() == {
                "updates": [[2, ["!t1:x", ["@u1:x"]]], [3, ["!t2:x", ["@u2:x"]]]],
                "upto": 3,
                "limited": False,
            }
        call = ep.StreamUpdatesCall(stream="typing", writer="w1", from_token=0, upto=3, limit=2)
        query = "writer=w1&from=0&upto=3&limit=2"  # as earlier releases sent it
        assert ep.STREAM_UPDATES.url(call) == f"/streams/typing/updates?{query}"
        assert await w2.http_client.call(ep.STREAM_UPDATES, "w1", call) == {
            "updates": [[1, ["!t0:x", ["@u0:x"]]], [2, ["!t1:x", ["@u1:x"]]]],
            "upto": 2,
            "limited": True,
        }
        for query, code in [
            ("typing/updates?from=x", (400, "M_INVALID_PARAM")),
            ("typing/updates", (400, "M_MISSING_PARAM")),
            ("typing/updates?from=0&limit=0", (400, "M_INVALID_PARAM")),
            ("typing/updates?from=0&limit=10001", (400, "M_INVALID_PARAM")),
            ("typing/updates?from=0&limit=x", (400, "M_INVALID_PARAM")),
            ("typing/updates?from=0&upto=x", (400, "M_INVALID_PARAM")),
            ("typing/updates?from=0&upto=1.5", (400, "M_INVALID_PARAM")),
            ("typing/updates?from=", (400, "M_INVALID_PARAM")),
            ("typing/updates?from=%EF%BC%91", (400, "M_INVALID_PARAM")),  # a fullwidth 1
            ("typing/updates?from=" + "1" * 21, (400, "M_INVALID_PARAM")),
            ("typing/updates?upto=3&limit=2", (400, "M_MISSING_PARAM")),
            ("typing/updates?writer=w2&from=0", (400, "M_INVALID_PARAM")),
            ("nosuch/updates?from=x", (404, "M_NOT_FOUND")),  # the stream first
            ("nosuch/updates?from=0", (404, "M_NOT_FOUND")),
            ("events/updates?from=0", (404, "M_NOT_FOUND")),
            ("events/updates?from=x", (404, "M_NOT_FOUND")),  # no rows here: before the query
        ]:
            status, body = await error("GET", f"{base['w1']}/streams/{query}")
            assert (status, body["errcode"]) == code, query
        status, body = await error("GET", f"{base['w2']}/streams/typing/updates?from=0")
        assert (status, body["errcode"]) == (404, "M_NOT_FOUND")
        status, body = await error("GET", f"{base['w1']}/streams/typing/updates?from=3")
        assert (status, body) == (200, {"updates": [], "upto": 3, "limited": False})  # upto: now
        status, body = await error("GET", f"{base['w1']}/streams/typing/updates?from=-5&upto=0")
        assert (status, body["errcode"]) == (410, "IO.ROOMSTREAM.STREAM_TOO_OLD")


async def test_bearer_token_required_when_a_secret_is_configured(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = await cluster_factory(
        "tcp",
        stream_writers={"events": ["w1"], "typing": ["w1"]},
        instances=tcp_instances("w1", http=True),
        replication={"shared_secret": "hunter2"},
    )
    w1 = await cluster.start("w1")
    url = f"{w1.http_client.base_url('w1')}/health"
    async with aiohttp.ClientSession() as http:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "hunter2"}):
            async with http.get(url, headers=headers) as r:
                assert r.status == 401
                assert (await r.json())["errcode"] == "M_UNAUTHORIZED"
        async with http.get(url, headers={"Authorization": "Bearer hunter2"}) as r:
            assert r.status == 200
            assert (await r.json())["instance"] == "w1"
    health = await w1.http_client.call(ep.HEALTH, "w1", ep.HealthCall())  # the client sends it
    assert health["status"] == "ok"
    assert PREFIX in url


async def test_writer_down_unknown_room_and_second_create_are_matrix_errors(
    cluster_factory: ClusterFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    cluster = await cluster_factory(
        "tcp",
        stream_writers={"events": ["w1", "w2"]},
        instances=tcp_instances("w1", "w2", http=True),
    )
    w1 = await cluster.start("w1")  # w2 stays down for now
    alice = f"@alice:{cluster.config.server_name}"
    by_owner = await rooms_by_owner(
        lambda i: w1.http_client.call(
            ep.CREATE_NAMED_ROOM, "w1", ep.CreateNamedRoomCall(alice, f"r{i}")
        ),
        ["w1", "w2"],
        1,
    )
    base = w1.http_client.base_url("w1")
    message = {"sender": alice, "type": "m.room.message", "content": {"body": "hi"}}
    caplog.set_level(logging.INFO, logger="roomstream")
    async with aiohttp.ClientSession(headers=internal_auth(cluster.config)) as http:

        async def post(room: str, body: dict[str, object]) -> tuple[int, dict[str, object]]:
            async with http.post(f"{base}/rooms/{room}/send_event", json=body) as r:
                assert r.content_type == "application/json", await r.text()
                if r.status == 503:
                    assert r.headers["Retry-After"] == "1"
                return r.status, await r.json()

        # The owner (w2) is down: 503 M_UNAVAILABLE with retry_after_ms, every time,
        # and one log line for the whole outage.
        for _ in range(10):
            status, body = await post(by_owner["w2"][0], message)
            assert (status, body["errcode"], body["retry_after_ms"]) == (503, "M_UNAVAILABLE", 1000)
        outage = [r for r in caplog.records if "w2 is unreachable" in r.getMessage()]
        assert len(outage) == 1 and outage[0].levelno == logging.WARNING
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]

        await cluster.start("w2")
        status, body = await post(by_owner["w2"][0], message)
        assert status == 200, body
        assert any("w2 is reachable again" in r.getMessage() for r in caplog.records)

        # A room nobody has: 404, whichever writer owns its ID (locally or forwarded).
        for owner in ("w1", "w2"):
            [unknown] = room_ids_for_writer(owner, ["w1", "w2"], "nowhere", prefix="unknown")
            status, body = await post(unknown, message)
            assert (status, body["errcode"]) == (404, "M_NOT_FOUND"), (owner, body)

        # A second m.room.create into an existing room: 400 with a Matrix code.
        for room in (by_owner["w1"][0], by_owner["w2"][0]):
            create = {"sender": alice, "type": "m.room.create", "state_key": "", "content": {}}
            status, body = await post(room, create)
            assert (status, body["errcode"]) == (400, "M_INVALID_PARAM"), body
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


async def test_forwarded_client_writes_are_validated_and_only_taken_by_their_writer(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = await cluster_factory(
        "tcp",
        stream_writers={"events": ["w1"], "account_data": ["w1"], "typing": ["w1"]},
        instances=tcp_instances("w1", "w2", http=True),
    )
    w1 = await cluster.start("w1")
    await cluster.start("w2")
    alice = f"@alice:{cluster.config.server_name}"
    base = {name: w1.http_client.base_url(name) + "/client" for name in ("w1", "w2")}
    good = {"user_id": alice, "type": "org.example.a", "content": {"a": 1}}
    async with aiohttp.ClientSession(headers=internal_auth(cluster.config)) as http:

        async def post(url: str, body: object) -> tuple[int, dict[str, object]]:
            async with http.post(url, json=body) as r:
                return r.status, await r.json()

        # Not a writer of the stream: refused, not forwarded again.
        for route, body in (
            ("account_data", good),
            ("typing", {"room_id": "!r", "user_id": alice, "typing": True, "timeout": 1}),
            ("create_room", {"creator": alice, "request": {}}),
            ("receipt", {}),  # receipts are written by main, which is not running
            ("send", {"room_id": "!r"}),
            ("end_sessions", {"user_id": alice}),  # caches: main too
        ):
            status, answer = await post(f"{base['w2']}/{route}", body)
            assert (status, answer["errcode"]) == (421, "IO.ROOMSTREAM.WRONG_WRITER"), answer
        for body, expected in (
            ({**good, "user_id": None}, (400, "M_MISSING_PARAM")),
            ({**good, "user_id": "alice"}, (400, "M_INVALID_PARAM")),
            ({**good, "type": "a\x00"}, (400, "M_INVALID_PARAM")),
            ({**good, "content": [1]}, (400, "M_BAD_JSON")),
            ({**good, "room_id": 5}, (400, "M_BAD_JSON")),
            ([], (400, "M_BAD_JSON")),
        ):
            status, answer = await post(f"{base['w1']}/account_data", body)
            assert (status, answer["errcode"]) == expected, (body, answer)
        # create_room on an instance that does not write events: refused before the
        # body is read (400 M_UNRECOGNIZED, as ever; the forwarded writes answer 421).
        w2_base = w1.http_client.base_url("w2")
        for body in ({"creator": alice}, {}):
            status, answer = await post(f"{w2_base}/create_room", body)
            assert (status, answer["errcode"]) == (400, "M_UNRECOGNIZED"), body
        status, answer = await post(f"{base['w1']}/account_data", good)
        assert (status, answer) == (200, {})
        rows = await w1.engine.db.run_interaction(
            "test_query",
            lambda txn: txn.query(
                "SELECT instance_name, content FROM account_data WHERE user_id = ?", (alice,)
            ),
        )
        assert rows == [("w1", '{"a":1}')]
        status, answer = await post(
            f"{base['w1']}/create_room", {"creator": alice, "request": {"room_version": "10"}}
        )
        assert status == 200, answer
        room_id = str(answer["room_id"])
        events = w1.http_client.base_url("w1") + f"/rooms/{room_id}/send_event"
        redaction = {"sender": alice, "type": "m.room.redaction", "content": {}}
        status, answer = await post(events, {**redaction, "redacts": "not-an-event-id"})
        assert (status, answer["errcode"]) == (400, "M_INVALID_PARAM")
        status, answer = await post(events, {**redaction, "redacts": "$gone"})
        assert status == 200, answer
        stored = await w1.engine.store.get_event(str(answer["event_id"]))
        assert stored is not None and stored.data["redacts"] == "$gone"
        assert "redacts" not in stored.data["content"]
        # An idempotent client send: the same (device, transaction) gives the same event.
        send = {
            "room_id": room_id,
            "user_id": alice,
            "device_id": "PHONE",
            "txn_id": "t1",
            "type": "m.room.message",
            "content": {"body": "hi"},
        }
        for body, expected in (
            ({**send, "txn_id": None}, (400, "M_MISSING_PARAM")),
            ({**send, "device_id": 5}, (400, "M_BAD_JSON")),
            ({**send, "room_id": "nope"}, (400, "M_INVALID_PARAM")),
            ({**send, "redacts": "x"}, (400, "M_INVALID_PARAM")),
        ):
            status, answer = await post(f"{base['w1']}/send", body)
            assert (status, answer["errcode"]) == expected, (body, answer)
        first = await post(f"{base['w1']}/send", send)
        again = await post(f"{base['w1']}/send", {**send, "content": {"body": "other"}})
        assert first[0] == 200 and first == again, (first, again)
        other_device = await post(f"{base['w1']}/send", {**send, "device_id": "LAPTOP"})
        assert other_device[0] == 200 and other_device != first


async def test_a_call_may_have_a_time_limit_of_its_own(tmp_path: Path) -> None:
    """A call given ``seconds`` waits that long for an answer, whatever the client's
    default: a federation join carried out by a room's writer takes longer than a send."""
    port = free_port()
    config = make_config(
        DatabaseConfig(engine="sqlite", path=str(tmp_path / "t.db")),
        tmp_path,
        "tcp",
        stream_writers={},
        instances={"main": {"internal_port": port}},
    )
    answered = asyncio.Event()

    async def slow_health(request: web.Request) -> web.Response:
        await answered.wait()
        return web.json_response({"instance": "main", "status": "ok"})

    app = web.Application()
    app.router.add_get(PREFIX + "/health", slow_health)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    client = InternalHttpClient(config, timeout=0.2)
    try:
        waiting = asyncio.create_task(client.call(ep.HEALTH, "main", ep.HealthCall(), seconds=30))
        # A call with the default limit, started after it, gives up first...
        with pytest.raises(ServiceUnavailableError):
            await client.call(ep.HEALTH, "main", ep.HealthCall())
        # ... while the one with its own limit still waits, and gets the answer.
        assert not waiting.done()
        answered.set()
        assert (await waiting)["status"] == "ok"
    finally:
        await client.close()
        await runner.cleanup()
