"""The internal HTTP API's endpoints, each defined once (see :mod:`roomstream.replication.http`)."""

from __future__ import annotations

from typing import Any, TypeVar

from roomstream.errors import Codes, MatrixError


def _is_identifier(value: str) -> bool:
    """An ID or event type we can store: 1..255 characters, none of them a control
    character (NUL, for one, is refused by PostgreSQL text columns)."""
    return 0 < len(value) <= 255 and value.isprintable()


T = TypeVar("T")


def _field(body: dict[str, Any], name: str, kind: type[T], *, optional: bool = False) -> T:
    """``body[name]`` of JSON type ``kind`` (``None`` when optional and absent)."""
    value = body.get(name)
    if value is None:
        if optional:
            return None  # type: ignore[return-value]
        raise MatrixError(400, Codes.MISSING_PARAM, f"{name} is required")
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise MatrixError(400, Codes.BAD_JSON, f"{name} must be a {kind.__name__}")
    return value


def _identifier_field(
    body: dict[str, Any], name: str, *, sigil: str = "", optional: bool = False
) -> str:
    """A string field that is an ID or type (:func:`_is_identifier`), starting with
    ``sigil``."""
    value = _field(body, name, str, optional=optional)
    if value is not None and (not _is_identifier(value) or not value.startswith(sigil)):
        raise MatrixError(400, Codes.INVALID_PARAM, f"{name} is not a valid ID: {value[:300]!r}")
    return value
