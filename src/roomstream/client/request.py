"""Parsing Client-Server API requests: JSON bodies, fields, query parameters, tokens.

Every helper raises :class:`~roomstream.errors.MatrixError` (400 with ``M_NOT_JSON``,
``M_BAD_JSON``, ``M_MISSING_PARAM`` or ``M_INVALID_PARAM``) for input it refuses, so
handlers never see malformed values.
"""

from __future__ import annotations

from typing import Any, TypeVar, overload

from aiohttp import web

from roomstream.errors import (
    BadJsonError,
    InvalidParamError,
    MissingParamError,
    MissingTokenError,
)
from roomstream.grammar import MAX_ID_BYTES, is_room_id_to_look_up, utf8_length
from roomstream.httpbase import json_response, read_json

__all__ = [
    "access_token",
    "json_response",
    "optional",
    "path_value",
    "query_bool",
    "query_int",
    "read_json",
    "required",
    "room_id_in_path",
]

T = TypeVar("T")


def _type_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {str: "a string", bool: "a boolean", int: "an integer", dict: "an object"}
    names |= {list: "a list", float: "a number"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _is(value: Any, kind: type | tuple[type, ...]) -> bool:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        return False  # JSON true is not an integer
    return isinstance(value, kinds)


@overload
def optional(body: dict[str, Any], name: str, kind: type[T]) -> T | None: ...
@overload
def optional(body: dict[str, Any], name: str, kind: type[T], default: T) -> T: ...
def optional(body: dict[str, Any], name: str, kind: type[T], default: T | None = None) -> T | None:
    """``body[name]`` if present and of ``kind`` (``null`` counts as absent)."""
    value = body.get(name)
    if value is None:
        return default
    if not _is(value, kind):
        raise BadJsonError(f"{name} must be {_type_name(kind)}")
    return value  # type: ignore[no-any-return]


def required(body: dict[str, Any], name: str, kind: type[T]) -> T:
    value = optional(body, name, kind)
    if value is None:
        raise MissingParamError(f"missing {name}")
    return value


def query_int(
    request: web.Request, name: str, default: int, *, low: int = 0, high: int = 2**53 - 1
) -> int:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    digits = raw[1:] if raw.startswith("-") else raw
    if not digits.isascii() or not digits.isdigit() or len(raw) > 17:
        raise InvalidParamError(f"{name} must be an integer")
    value = int(raw)
    if not low <= value <= high:
        raise InvalidParamError(f"{name} must be in {low}..{high}")
    return value


def query_bool(request: web.Request, name: str, default: bool = False) -> bool:
    raw = request.query.get(name)
    if raw is None:
        return default
    if raw not in ("true", "false"):
        raise InvalidParamError(f"{name} must be true or false")
    return raw == "true"


def access_token(request: web.Request) -> str | None:
    """The token from ``Authorization: Bearer`` or the deprecated ``access_token`` query."""
    header = request.headers.get("Authorization")
    if header is not None:
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise MissingTokenError("Authorization must be 'Bearer <token>'")
        return token.strip()
    return request.query.get("access_token")


def path_value(request: web.Request, name: str) -> str:
    """The ``{name}`` path value (``""`` when the route has no such part); longer than an
    identifier may be (:data:`~roomstream.grammar.MAX_ID_BYTES`): ``M_INVALID_PARAM``."""
    value = request.match_info.get(name, "")
    if utf8_length(value) > MAX_ID_BYTES:
        raise InvalidParamError(f"{name} is too long")
    return value


def room_id_in_path(request: web.Request) -> str:
    """The ``{room_id}`` path value, if it can name a room (``M_INVALID_PARAM`` if not;
    :func:`~roomstream.grammar.is_room_id_to_look_up`: lenient, an unknown room is a 404
    later)."""
    room_id = request.match_info["room_id"]
    if not is_room_id_to_look_up(room_id):
        raise InvalidParamError(f"not a room ID: {room_id[:300]!r}")
    return room_id
