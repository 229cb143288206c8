"""Account management with several processes (PostgreSQL, Redis): a password change
made on the reader logs the other devices out on every process (forwarded to the
``caches`` writer with what to keep), and a deactivation made there leaves rooms other
processes write and ends the tokens everywhere."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp

from tests.support.cluster import run_cluster
from tests.support.e2e_keys import password_auth


async def test_password_change_and_deactivation_across_processes(
    tmp_path: Path, pg_database: str, redis_url: str
) -> None:
    async with run_cluster(tmp_path, pg_database, {"caches": ["w1"]}) as (_, raw):
        urls = {
            name: f"http://127.0.0.1:{raw['instances'][name]['http_port']}/_matrix/client/v3"
            for name in ("reader", "w1", "w2")
        }
        async with aiohttp.ClientSession() as session:

            async def call(
                name: str, method: str, path: str, token: str | None, body: Any = None
            ) -> tuple[int, Any]:
                headers = {} if token is None else {"Authorization": f"Bearer {token}"}
                async with session.request(
                    method, urls[name] + path, headers=headers, json=body
                ) as resp:
                    return resp.status, await resp.json()

            async def whoami_everywhere(token: str, expected: int) -> None:
                """Until every process answers ``expected`` (the caches row travels)."""
                for name in urls:
                    for _ in range(300):  # bounded: replication is asynchronous
                        status, _answer = await call(name, "GET", "/account/whoami", token)
                        if status == expected:
                            break
                        await asyncio.sleep(0.05)
                    assert status == expected, (name, token[:8])

            register = {"username": "dora", "password": "pw-1", "auth": {"type": "m.login.dummy"}}
            status, answer = await call("reader", "POST", "/register", None, register)
            assert status == 200, answer
            user_id, token = answer["user_id"], answer["access_token"]
            login = {"type": "m.login.password", "user": "dora", "password": "pw-1"}
            status, answer = await call(
                "w2", "POST", "/login", None, {**login, "device_id": "PHONE"}
            )
            phone = answer["access_token"]
            await whoami_everywhere(phone, 200)  # in every process's token cache now
            await whoami_everywhere(token, 200)
            change = {"new_password": "pw-2", "auth": password_auth(user_id, "pw-1")}
            status, answer = await call("reader", "POST", "/account/password", token, change)
            assert status == 200, answer
            await whoami_everywhere(phone, 401)
            await whoami_everywhere(token, 200)  # the requesting token stays, everywhere
            # Deactivation: rooms written by other processes are left; tokens end everywhere.
            status, answer = await call(
                "w2", "POST", "/register", None, {**register, "username": "ed", "password": "pw-ed"}
            )
            ed = answer["access_token"]
            room_ids = []
            for name in ("w1", "w2"):
                status, answer = await call(
                    name, "POST", "/createRoom", ed, {"preset": "public_chat"}
                )
                assert status == 200, answer
                room_ids.append(answer["room_id"])
                status, answer = await call(
                    "reader", "POST", f"/rooms/{answer['room_id']}/join", token, {}
                )
                assert status == 200, answer
            deactivate = {"auth": password_auth(user_id, "pw-2")}
            status, answer = await call("reader", "POST", "/account/deactivate", token, deactivate)
            assert (status, answer) == (200, {"id_server_unbind_result": "no-support"})
            await whoami_everywhere(token, 401)
            for room_id in room_ids:
                path = f"/rooms/{room_id}/state/m.room.member/{user_id}"
                status, answer = await call("w1", "GET", path, ed)
                assert (status, answer["membership"]) == (200, "leave")
            status, answer = await call("w1", "POST", "/login", None, {**login, "password": "pw-2"})
            assert (status, answer["errcode"]) == (403, "M_USER_DEACTIVATED")
