"""The internal HTTP API: in-memory stream updates, routed send_event, errors, bearer auth."""

from __future__ import annotations

import aiohttp
import pytest

from roomstream.replication.http import PREFIX
from roomstream.replication.sharding import writer_for_room

from .test_replication_nodes import (
    ClusterFactory,
    cluster_factory,  # noqa: F401  (fixture)
    tcp_instances,
)


@pytest.fixture
def engine_name() -> str:
    return "postgres"  # two writers persisting events: the multi-process engine


async def test_send_event_is_routed_to_the_owner_and_errors_are_matrix_json(
    cluster_factory: ClusterFactory,  # noqa: F811
) -> None:
    cluster = await cluster_factory(
        "tcp",
        stream_writers={"events": ["w1", "w2"], "typing": ["w1"]},
        instances=tcp_instances("w1", "w2", http=True),
    )
    w1 = await cluster.start("w1")
    w2 = await cluster.start("w2")
    alice = f"@alice:{cluster.config.server_name}"
    rooms = [await w1.http_client.create_room("w1", alice, f"room{i}") for i in range(6)]
    owners = {room: writer_for_room(room, ["w1", "w2"]) for room in rooms}
    assert set(owners.values()) == {"w1", "w2"}  # six rooms land on both writers
    base = {name: w1.http_client.base_url(name) for name in ("w1", "w2")}
    async with aiohttp.ClientSession() as http:
        for room, owner in owners.items():
            for entry in ("w1", "w2"):  # either instance accepts it; the owner persists it
                body = {"sender": alice, "type": "m.room.message", "content": {"body": entry}}
                async with http.post(f"{base[entry]}/rooms/{room}/send_event", json=body) as r:
                    assert r.status == 200, await r.text()
                    result = await r.json()
                rows = await w1.engine.db.run_interaction(
                    lambda txn, e=result["event_id"]: txn.query(
                        "SELECT instance_name, stream_ordering FROM events WHERE event_id = ?", (e,)
                    )
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
        assert await w2.http_client.get_updates("w1", "typing", 0, 3, 2) == (
            [(1, ["!t0:x", ["@u0:x"]]), (2, ["!t1:x", ["@u1:x"]])],
            2,
            True,
        )
        for query, code in [
            ("typing/updates?from=x", (400, "M_INVALID_PARAM")),
            ("typing/updates", (400, "M_MISSING_PARAM")),
            ("typing/updates?from=0&limit=0", (400, "M_INVALID_PARAM")),
            ("nosuch/updates?from=0", (404, "M_NOT_FOUND")),
            ("events/updates?from=0", (404, "M_NOT_FOUND")),
        ]:
            status, body = await error("GET", f"{base['w1']}/streams/{query}")
            assert (status, body["errcode"]) == code, query
        status, body = await error("GET", f"{base['w2']}/streams/typing/updates?from=0")
        assert (status, body["errcode"]) == (404, "M_NOT_FOUND")


async def test_bearer_token_required_when_a_secret_is_configured(
    cluster_factory: ClusterFactory,  # noqa: F811
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
    assert (await w1.http_client.health("w1"))["status"] == "ok"  # the client sends it
    assert PREFIX in url
