"""The key endpoints (Server-Server API, "Retrieving server keys"), unauthenticated:

- ``GET /_matrix/key/v2/server`` (and the deprecated ``.../server/{keyId}``): our keys,
  signed (:meth:`Keyring.own_keys`);
- ``GET /_matrix/key/v2/query/{serverName}`` (``?minimum_valid_until_ts=``) and
  ``POST /_matrix/key/v2/query``: the notary (:meth:`Keyring.notary_query`).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from roomstream.errors import BadJsonError, InvalidParamError
from roomstream.federation.keyring import Keyring
from roomstream.httpbase import json_response, read_json

__all__ = ["install_key_routes"]


def install_key_routes(app: web.Application, keyring: Keyring) -> None:
    """Register the key endpoints on ``app``."""

    async def server_keys(request: web.Request) -> web.Response:
        return json_response(keyring.own_keys())

    async def query_one(request: web.Request) -> web.Response:
        server = request.match_info["server_name"]
        raw_ts = request.query.get("minimum_valid_until_ts")
        criteria: dict[str, Any] = {}
        if raw_ts is not None:
            if not raw_ts.isascii() or not raw_ts.isdigit():
                raise InvalidParamError("minimum_valid_until_ts must be an integer")
            criteria = {"minimum_valid_until_ts": int(raw_ts)}
        return json_response(await keyring.notary_query({server: {"": criteria}}))

    async def query_many(request: web.Request) -> web.Response:
        body = await read_json(request)
        asked = body.get("server_keys")
        if not isinstance(asked, dict) or not all(isinstance(v, dict) for v in asked.values()):
            raise BadJsonError("'server_keys' must map server names to objects")
        return json_response(await keyring.notary_query(asked))

    app.router.add_get("/_matrix/key/v2/server", server_keys)
    app.router.add_get("/_matrix/key/v2/server/{key_id}", server_keys)
    app.router.add_get("/_matrix/key/v2/query/{server_name}", query_one)
    app.router.add_post("/_matrix/key/v2/query", query_many)
