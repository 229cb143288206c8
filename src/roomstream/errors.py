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


class MatrixError(Exception):
    """An error to report to whoever sent the input: HTTP status, errcode and message."""

    def __init__(self, http_status: int, errcode: Codes | str, message: str) -> None:
        super().__init__(f"{errcode}: {message}")
        self.http_status = http_status
        self.errcode = str(errcode)
        self.message = message

    def to_json(self) -> dict[str, str]:
        return {"errcode": self.errcode, "error": self.message}


class BadEventError(MatrixError):
    """An event that is malformed, too large, or whose hashes or ID do not match."""

    def __init__(self, errcode: Codes | str, message: str) -> None:
        super().__init__(400, errcode, message)


class AuthError(MatrixError):
    """An event (or request) that the authorization rules refuse."""

    def __init__(self, message: str, errcode: Codes | str = Codes.FORBIDDEN) -> None:
        super().__init__(403, errcode, message)
