"""End-to-end keys of other servers' users for ``/keys/query`` and ``/keys/claim``.

The client layer declares what it needs (:class:`RemoteKeys`); the process assembly gives
it the federation implementation (``roomstream.federation.remote_keys``) when federation
is on. :class:`KeysWithRemote` answers a request whose users are on several servers: this
server's from its own store (:class:`~roomstream.e2e.E2eKeys`), each other server's by
asking it, all at once, a server that does not answer in time listed in ``failures``
(as the spec and Synapse do) without failing the request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from roomstream.e2e import E2eKeys

__all__ = ["KeysWithRemote", "RemoteKeys"]

logger = logging.getLogger(__name__)

#: Seconds another server has to answer (Synapse's ``timeout`` default for /keys/query).
REMOTE_TIMEOUT = 10.0
#: The answer parts that hold keys by user.
_QUERY_PARTS = ("device_keys", "master_keys", "self_signing_keys")


class RemoteKeys(Protocol):
    async def query(self, server: str, wanted: Mapping[str, list[str]]) -> Mapping[str, Any]:
        """That server's ``/user/keys/query`` answer for its users in ``wanted``."""
        ...

    async def claim(
        self, server: str, wanted: Mapping[str, Mapping[str, str]]
    ) -> Mapping[str, Any]:
        """That server's ``/user/keys/claim`` answer for its users in ``wanted``."""
        ...


def _failure(exc: BaseException) -> dict[str, Any]:
    status = getattr(exc, "http_status", 503)
    return {"status": status if isinstance(status, int) else 503, "message": str(exc)[:500]}


class KeysWithRemote:
    def __init__(self, keys: E2eKeys, server_name: str, remote: RemoteKeys | None) -> None:
        self.keys = keys
        self.server_name = server_name
        self.remote = remote

    def _split(self, wanted: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        local: dict[str, Any] = {}
        remote: dict[str, dict[str, Any]] = {}
        for user_id, value in wanted.items():
            server = user_id.partition(":")[2]
            if server == self.server_name or self.remote is None:
                local[user_id] = value
            else:
                remote.setdefault(server, {})[user_id] = value
        return local, remote

    async def _ask_each(
        self,
        remote: Mapping[str, dict[str, Any]],
        ask: Callable[[str, dict[str, Any]], Awaitable[Mapping[str, Any]]],
        result: dict[str, Any],
    ) -> list[tuple[dict[str, Any], Mapping[str, Any]]]:
        """Ask each server for its users, all at once; (users asked, answer) of those
        that answered in time, the others listed in ``result["failures"]``."""
        answers = await asyncio.gather(
            *(
                asyncio.wait_for(ask(server, users), REMOTE_TIMEOUT)
                for server, users in remote.items()
            ),
            return_exceptions=True,
        )
        answered = []
        for (server, users), answer in zip(remote.items(), answers, strict=True):
            if isinstance(answer, BaseException):
                logger.info("keys of %s users not fetched: %s", server, answer)
                result["failures"][server] = _failure(answer)
            else:
                answered.append((users, answer))
        return answered

    async def query(self, requester: str, wanted: Mapping[str, list[str]]) -> dict[str, Any]:
        local, remote = self._split(wanted)
        result = await self.keys.query(requester, local)
        if not remote or self.remote is None:
            return result
        for users, answer in await self._ask_each(remote, self.remote.query, result):
            for part in _QUERY_PARTS:
                by_user = answer.get(part)
                if not isinstance(by_user, dict):
                    continue
                for user_id, keys in by_user.items():
                    # Only what that server may speak for: its own users, asked for.
                    if user_id in users and isinstance(keys, dict):
                        result[part][user_id] = keys
        return result

    async def claim(self, wanted: Mapping[str, Mapping[str, str]]) -> dict[str, Any]:
        local, remote = self._split(wanted)
        result = await self.keys.claim(local)
        if not remote or self.remote is None:
            return result
        for users, answer in await self._ask_each(remote, self.remote.claim, result):
            claimed = answer.get("one_time_keys")
            if not isinstance(claimed, dict):
                continue
            for user_id, by_device in claimed.items():
                if user_id in users and isinstance(by_device, dict):
                    result["one_time_keys"][user_id] = by_device
        return result
