"""Other servers' users' end-to-end keys, asked of their servers
(:class:`roomstream.client.remote_keys.RemoteKeys` over federation)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from roomstream.errors import RemoteServerError
from roomstream.federation.remote_rooms import FederationRequester

__all__ = ["RemoteKeysClient"]


class RemoteKeysClient:
    def __init__(self, client: FederationRequester) -> None:
        self.client = client

    async def query(self, server: str, wanted: Mapping[str, list[str]]) -> Mapping[str, Any]:
        answer = await self.client.request(
            "POST",
            server,
            "/_matrix/federation/v1/user/keys/query",
            content={"device_keys": {u: list(d) for u, d in wanted.items()}},
        )
        if not isinstance(answer, dict):
            raise RemoteServerError(f"{server} answered /user/keys/query with no object")
        return answer

    async def claim(
        self, server: str, wanted: Mapping[str, Mapping[str, str]]
    ) -> Mapping[str, Any]:
        answer = await self.client.request(
            "POST",
            server,
            "/_matrix/federation/v1/user/keys/claim",
            content={"one_time_keys": {u: dict(d) for u, d in wanted.items()}},
        )
        if not isinstance(answer, dict):
            raise RemoteServerError(f"{server} answered /user/keys/claim with no object")
        return answer
