"""Errors with Matrix error codes, shared by every layer that rejects input."""

from __future__ import annotations

from enum import StrEnum


class Codes(StrEnum):
    """Matrix error codes (``errcode``) that roomstream produces."""

    BAD_JSON = "M_BAD_JSON"
    NOT_JSON = "M_NOT_JSON"
    INVALID_PARAM = "M_INVALID_PARAM"
    MISSING_PARAM = "M_MISSING_PARAM"
    TOO_LARGE = "M_TOO_LARGE"
    FORBIDDEN = "M_FORBIDDEN"
    NOT_FOUND = "M_NOT_FOUND"
    UNKNOWN = "M_UNKNOWN"
    UNSUPPORTED_ROOM_VERSION = "M_UNSUPPORTED_ROOM_VERSION"
    INCOMPATIBLE_ROOM_VERSION = "M_INCOMPATIBLE_ROOM_VERSION"
    UNRECOGNIZED = "M_UNRECOGNIZED"
    LIMIT_EXCEEDED = "M_LIMIT_EXCEEDED"
    UNAUTHORIZED = "M_UNAUTHORIZED"
    #: A process this request needs (e.g. the room's events writer) is unreachable.
    UNAVAILABLE = "M_UNAVAILABLE"


class MatrixError(Exception):
    """An error to report to whoever sent the input: HTTP status, errcode and message."""

    def __init__(
        self,
        http_status: int,
        errcode: Codes | str,
        message: str,
        *,
        retry_after_ms: int | None = None,
    ) -> None:
        super().__init__(f"{errcode}: {message}")
        self.http_status = http_status
        self.errcode = str(errcode)
        self.message = message
        #: When set, the client may retry after this many milliseconds (503, 429).
        self.retry_after_ms = retry_after_ms

    def to_json(self) -> dict[str, str | int]:
        body: dict[str, str | int] = {"errcode": self.errcode, "error": self.message}
        if self.retry_after_ms is not None:
            body["retry_after_ms"] = self.retry_after_ms
        return body


class UnknownRoomError(MatrixError, LookupError):
    """The room is not known here (404 ``M_NOT_FOUND``); also a ``LookupError``."""

    def __init__(self, room_id: str, detail: str = "") -> None:
        super().__init__(404, Codes.NOT_FOUND, f"unknown room {room_id}{detail}")
        self.room_id = room_id


class ServiceUnavailableError(MatrixError):
    """Another process this request needs cannot be reached (503 ``M_UNAVAILABLE``)."""

    def __init__(self, message: str, *, retry_after_ms: int = 1000) -> None:
        super().__init__(503, Codes.UNAVAILABLE, message, retry_after_ms=retry_after_ms)


class BadEventError(MatrixError):
    """An event that is malformed, too large, or whose hashes or ID do not match."""

    def __init__(self, errcode: Codes | str, message: str) -> None:
        super().__init__(400, errcode, message)


class AuthError(MatrixError):
    """An event (or request) that the authorization rules refuse."""

    def __init__(self, message: str, errcode: Codes | str = Codes.FORBIDDEN) -> None:
        super().__init__(403, errcode, message)
