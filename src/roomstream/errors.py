"""The errors roomstream reports, named: each fixes its HTTP status and Matrix errcode once.

Every layer that rejects input raises one of the named errors below (``NotFoundError``,
``InvalidParamError``, ...), never a status and an errcode paired by hand: the library
packages (reading, rooms, accounts, events, state, sliding) say *what* went wrong and know
nothing of HTTP; the one middleware, :func:`roomstream.httpbase.matrix_error_middleware`,
turns any :class:`MatrixError` into an answer from the status and errcode its class fixes.

Invariants:

- every errcode roomstream produces is a member of :class:`Codes`, defined here only;
- every named error's ``(HTTP_STATUS, ERRCODE)`` is a class constant; ``MatrixError``
  itself, with an explicit status, is built only where an error from elsewhere is mapped
  (aiohttp's own HTTP errors, another process's JSON error answer), which
  ``tests/test_errors.py`` checks by scanning the sources.
"""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar


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
    USER_IN_USE = "M_USER_IN_USE"
    INVALID_USERNAME = "M_INVALID_USERNAME"
    UNKNOWN_TOKEN = "M_UNKNOWN_TOKEN"
    MISSING_TOKEN = "M_MISSING_TOKEN"
    GUEST_ACCESS_FORBIDDEN = "M_GUEST_ACCESS_FORBIDDEN"
    USER_DEACTIVATED = "M_USER_DEACTIVATED"
    #: 3PIDs: no validated third-party-identifier session is known (none ever is here).
    THREEPID_AUTH_FAILED = "M_THREEPID_AUTH_FAILED"
    #: 3PIDs: this server does not verify that medium (email, msisdn).
    THREEPID_MEDIUM_NOT_SUPPORTED = "M_THREEPID_MEDIUM_NOT_SUPPORTED"
    BAD_ALIAS = "M_BAD_ALIAS"
    ROOM_IN_USE = "M_ROOM_IN_USE"
    #: Sliding sync: the connection or snapshot ``pos`` names is gone; start again.
    UNKNOWN_POS = "M_UNKNOWN_POS"
    #: A process this request needs (e.g. the room's events writer) is unreachable.
    UNAVAILABLE = "M_UNAVAILABLE"
    #: Key backup: the version named is not the current one.
    WRONG_ROOM_KEYS_VERSION = "M_WRONG_ROOM_KEYS_VERSION"
    #: A signature that does not verify (``/keys/signatures/upload`` failures).
    INVALID_SIGNATURE = "M_INVALID_SIGNATURE"
    #: Media: an asynchronous upload's content has not arrived (yet).
    NOT_YET_UPLOADED = "M_NOT_YET_UPLOADED"
    #: Media: the media ID already has content (asynchronous uploads).
    CANNOT_OVERWRITE_MEDIA = "M_CANNOT_OVERWRITE_MEDIA"
    #: A limit of this server's resources (here: a user's media upload quota).
    RESOURCE_LIMIT_EXCEEDED = "M_RESOURCE_LIMIT_EXCEEDED"
    #: Internal API: the writer no longer holds the stream rows asked for.
    STREAM_TOO_OLD = "IO.ROOMSTREAM.STREAM_TOO_OLD"
    #: Internal API: this instance does not write the room (after one forward).
    WRONG_WRITER = "IO.ROOMSTREAM.WRONG_WRITER"
    #: Federation: no local user can authorise a restricted join (fedinbound).
    UNABLE_TO_AUTHORISE_JOIN = "M_UNABLE_TO_AUTHORISE_JOIN"


class MatrixError(Exception):
    """An error to report to whoever sent the input: HTTP status, errcode and message.

    Raise a named subclass; build one directly only to map an error from elsewhere."""

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


class NamedError(MatrixError):
    """A :class:`MatrixError` whose class fixes its status and errcode: raised with a
    message only."""

    HTTP_STATUS: ClassVar[int]
    ERRCODE: ClassVar[Codes]

    def __init__(self, message: str) -> None:
        super().__init__(self.HTTP_STATUS, self.ERRCODE, message)


# 400 -------------------------------------------------------------------------------------


class BadRequestError(NamedError):
    """A request refused for a reason no more specific errcode names (400 ``M_UNKNOWN``)."""

    HTTP_STATUS = 400
    ERRCODE = Codes.UNKNOWN


class InvalidParamError(NamedError):
    """A parameter (path, query or body) has a value it may not have (400 ``M_INVALID_PARAM``)."""

    HTTP_STATUS = 400
    ERRCODE = Codes.INVALID_PARAM


class MissingParamError(NamedError):
    """A required parameter is absent (400 ``M_MISSING_PARAM``)."""

    HTTP_STATUS = 400
    ERRCODE = Codes.MISSING_PARAM


class BadJsonError(NamedError):
    """JSON of the wrong shape: a wrong type, not an object, too deep (400 ``M_BAD_JSON``)."""

    HTTP_STATUS = 400
    ERRCODE = Codes.BAD_JSON


class ThreepidAuthFailedError(NamedError):
    """No validated 3PID session backs the request (400 ``M_THREEPID_AUTH_FAILED``)."""

    HTTP_STATUS = 400
    ERRCODE = Codes.THREEPID_AUTH_FAILED


class ThreepidMediumNotSupportedError(NamedError):
    """A 3PID medium this server cannot verify (400 ``M_THREEPID_MEDIUM_NOT_SUPPORTED``)."""

    HTTP_STATUS = 400
    ERRCODE = Codes.THREEPID_MEDIUM_NOT_SUPPORTED


class NotJsonError(NamedError):
    """A body or parameter that is not JSON at all (400 ``M_NOT_JSON``)."""

    HTTP_STATUS = 400
    ERRCODE = Codes.NOT_JSON


class UnrecognizedRequestError(NamedError):
    """A request this server does not understand (400 ``M_UNRECOGNIZED``)."""

    HTTP_STATUS = 400
    ERRCODE = Codes.UNRECOGNIZED


class UserInUseError(NamedError):
    """The user ID asked for is taken (400 ``M_USER_IN_USE``)."""

    HTTP_STATUS = 400
    ERRCODE = Codes.USER_IN_USE


class InvalidUsernameError(NamedError):
    """A localpart the user-ID grammar refuses, or too long (400 ``M_INVALID_USERNAME``)."""

    HTTP_STATUS = 400
    ERRCODE = Codes.INVALID_USERNAME


class BadAliasError(NamedError):
    """A room alias that does not exist here or names another room (400 ``M_BAD_ALIAS``)."""

    HTTP_STATUS = 400
    ERRCODE = Codes.BAD_ALIAS


class RoomInUseError(NamedError):
    """A room alias asked for at room creation is taken (400 ``M_ROOM_IN_USE``)."""

    HTTP_STATUS = 400
    ERRCODE = Codes.ROOM_IN_USE


class UnknownPosError(NamedError):
    """Sliding sync: the ``pos`` (or its connection) is not known (400 ``M_UNKNOWN_POS``)."""

    HTTP_STATUS = 400
    ERRCODE = Codes.UNKNOWN_POS


class ResourceLimitExceededError(NamedError):
    """A user is over a limit of this server's resources, here the media upload quota
    (400 ``M_RESOURCE_LIMIT_EXCEEDED``, as Synapse answers ``media_upload_limits``)."""

    HTTP_STATUS = 400
    ERRCODE = Codes.RESOURCE_LIMIT_EXCEEDED


# Events: 400, whatever the errcode; ``except BadEventError`` catches them all. ------------


class BadEventError(NamedError):
    """An event that is malformed, too large, or whose hashes or ID do not match (400).

    Abstract: raise one of its subclasses, which name the errcode."""

    HTTP_STATUS = 400


class MalformedEventError(BadEventError, BadJsonError):
    """An event (PDU) whose JSON breaks the format rules (400 ``M_BAD_JSON``)."""


class EventNotJsonError(BadEventError, NotJsonError):
    """An event (PDU) that is not JSON, or not UTF-8 (400 ``M_NOT_JSON``)."""


class EventTooLargeError(BadEventError):
    """An event, or one of its keys, over the spec's size limits (400 ``M_TOO_LARGE``)."""

    ERRCODE = Codes.TOO_LARGE


class EventRoomUnknownError(BadEventError):
    """An event of a room not known here, imported without its create event
    (400 ``M_NOT_FOUND``)."""

    ERRCODE = Codes.NOT_FOUND


class EventSignatureError(BadEventError):
    """A received event lacks a valid signature from a server that must sign it
    (400 ``M_UNAUTHORIZED``)."""

    ERRCODE = Codes.UNAUTHORIZED


class UnsupportedRoomVersionError(BadEventError):
    """A room version this server does not implement (400 ``M_UNSUPPORTED_ROOM_VERSION``)."""

    ERRCODE = Codes.UNSUPPORTED_ROOM_VERSION


# 401, 403 --------------------------------------------------------------------------------


class MissingTokenError(NamedError):
    """A request that needs an access token came without one (401 ``M_MISSING_TOKEN``)."""

    HTTP_STATUS = 401
    ERRCODE = Codes.MISSING_TOKEN


class UnknownTokenError(NamedError):
    """An access token that is not known, or expired (401 ``M_UNKNOWN_TOKEN``)."""

    HTTP_STATUS = 401
    ERRCODE = Codes.UNKNOWN_TOKEN


class UnauthorizedError(NamedError):
    """Internal API: a request without the shared bearer secret (401 ``M_UNAUTHORIZED``)."""

    HTTP_STATUS = 401
    ERRCODE = Codes.UNAUTHORIZED


class ForbiddenError(NamedError):
    """The requester may not do or see this (403 ``M_FORBIDDEN``)."""

    HTTP_STATUS = 403
    ERRCODE = Codes.FORBIDDEN


class UserDeactivatedError(NamedError):
    """Login to a deactivated account (403 ``M_USER_DEACTIVATED``)."""

    HTTP_STATUS = 403
    ERRCODE = Codes.USER_DEACTIVATED


class AuthError(ForbiddenError):
    """An event (or request) that the authorization rules refuse (403 ``M_FORBIDDEN``)."""


class WrongRoomKeysVersionError(NamedError):
    """Room keys sent to a backup version that is not the current one (403
    ``M_WRONG_ROOM_KEYS_VERSION``, with the ``current_version``)."""

    HTTP_STATUS = 403
    ERRCODE = Codes.WRONG_ROOM_KEYS_VERSION

    def __init__(
        self,
        message: str = "this is not the current backup version",
        *,
        current_version: int | None = None,
    ) -> None:
        super().__init__(message)
        self.current_version = None if current_version is None else str(current_version)

    def to_json(self) -> dict[str, str | int]:
        body = super().to_json()
        if self.current_version is not None:
            body["current_version"] = self.current_version
        return body


class GuestAccessForbiddenError(NamedError):
    """Guests may not do this: an endpoint outside the guests' list, or guest
    registration while guest access is off (403 ``M_GUEST_ACCESS_FORBIDDEN``)."""

    HTTP_STATUS = 403
    ERRCODE = Codes.GUEST_ACCESS_FORBIDDEN


# 404, 409, 410, 421 ---------------------------------------------------------------------


class NotFoundError(NamedError):
    """The thing asked for does not exist, or is not known here (404 ``M_NOT_FOUND``)."""

    HTTP_STATUS = 404
    ERRCODE = Codes.NOT_FOUND


class EndpointDisabledError(NamedError):
    """An endpoint this server knows and does not offer, such as URL previews
    (404 ``M_UNRECOGNIZED``, as Synapse answers when they are disabled)."""

    HTTP_STATUS = 404
    ERRCODE = Codes.UNRECOGNIZED


class UnknownRoomError(NotFoundError, LookupError):
    """The room is not known here (404 ``M_NOT_FOUND``); also a ``LookupError``."""

    def __init__(self, room_id: str, detail: str = "") -> None:
        super().__init__(f"unknown room {room_id}{detail}")
        self.room_id = room_id


class ConflictError(NamedError):
    """What the request would create exists already (409 ``M_UNKNOWN``, as Synapse answers
    for a room alias taken)."""

    HTTP_STATUS = 409
    ERRCODE = Codes.UNKNOWN


class CannotOverwriteMediaError(NamedError):
    """An asynchronous upload to a media ID that has content already, or is being
    uploaded to right now (409 ``M_CANNOT_OVERWRITE_MEDIA``)."""

    HTTP_STATUS = 409
    ERRCODE = Codes.CANNOT_OVERWRITE_MEDIA


class ContentTooLargeError(NamedError):
    """A request body (an upload) or content (an image to thumbnail) over the configured
    limit (413 ``M_TOO_LARGE``)."""

    HTTP_STATUS = 413
    ERRCODE = Codes.TOO_LARGE


class LimitExceededError(NamedError):
    """Too many of something at once, here pending media IDs (429 ``M_LIMIT_EXCEEDED``,
    with ``retry_after_ms``)."""

    HTTP_STATUS = 429
    ERRCODE = Codes.LIMIT_EXCEEDED

    def __init__(self, message: str, *, retry_after_ms: int | None = None) -> None:
        super().__init__(message)
        self.retry_after_ms = None if retry_after_ms is None else max(0, retry_after_ms)


class StreamRowsGoneError(NamedError):
    """Internal API: the writer no longer holds the stream rows asked for
    (410 ``IO.ROOMSTREAM.STREAM_TOO_OLD``)."""

    HTTP_STATUS = 410
    ERRCODE = Codes.STREAM_TOO_OLD


class WrongWriterError(NamedError):
    """Internal API: this instance does not write the room or stream, after one forward
    (421 ``IO.ROOMSTREAM.WRONG_WRITER``)."""

    HTTP_STATUS = 421
    ERRCODE = Codes.WRONG_WRITER


# 5xx ---------------------------------------------------------------------------------------


class InternalServerError(NamedError):
    """A failure of this server, not of the request (500 ``M_UNKNOWN``)."""

    HTTP_STATUS = 500
    ERRCODE = Codes.UNKNOWN


class NotYetUploadedError(NamedError):
    """Media whose asynchronous upload has not arrived within the wait asked for
    (504 ``M_NOT_YET_UPLOADED``)."""

    HTTP_STATUS = 504
    ERRCODE = Codes.NOT_YET_UPLOADED


class ServiceUnavailableError(NamedError):
    """Another process this request needs cannot be reached (503 ``M_UNAVAILABLE``)."""

    HTTP_STATUS = 503
    ERRCODE = Codes.UNAVAILABLE

    def __init__(self, message: str, *, retry_after_ms: int = 1000) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms


# Federation: joining and leaving rooms of other servers (roomstream.federation.remote_rooms)


class RemoteServerError(NamedError):
    """No server asked could do what the request needs of another homeserver (a join of
    a room this server is not in): none answered, or answers made no sense (502
    ``M_UNKNOWN``). A server's own refusal (403, 404) is passed on as it was given."""

    HTTP_STATUS = 502
    ERRCODE = Codes.UNKNOWN


# Federation transport (fedtransport) -------------------------------------------------------


class FederationUnauthorizedError(NamedError):
    """A federation request whose ``X-Matrix`` authorization is missing, malformed, not
    for this server or not signed by its origin's key (401 ``M_UNAUTHORIZED``)."""

    HTTP_STATUS = 401
    ERRCODE = Codes.UNAUTHORIZED


class FederationRequestError(MatrixError):
    """Another homeserver answered a request of ours with an error: its status and
    errcode (``M_UNKNOWN`` when its body was no Matrix error), and who it was.

    Built from the remote answer (so with an explicit status, as the module docstring
    allows for errors mapped from elsewhere)."""

    def __init__(self, destination: str, status: int, errcode: str, message: str) -> None:
        super().__init__(status, errcode, f"{destination}: {message}")
        self.destination = destination
        self.status = status


class FederationUnreachableError(NamedError):
    """Another homeserver could not be reached (discovery, connection, TLS, timeout)
    (502 ``M_UNKNOWN``); ``destination`` names it."""

    HTTP_STATUS = 502
    ERRCODE = Codes.UNKNOWN

    def __init__(self, destination: str, message: str) -> None:
        super().__init__(f"{destination}: {message}")
        self.destination = destination


class FederationDestinationRefusedError(FederationUnreachableError):
    """The destination resolves to an address the ``federation.ip_range_blacklist``
    refuses (loopback, private ranges...): nothing was sent (502 ``M_UNKNOWN``)."""


# Federation, inbound room side (fedinbound) -----------------------------------------------


class FederationTransactionTooLargeError(NamedError):
    """A federation transaction with more than 50 PDUs or 100 EDUs (400 ``M_TOO_LARGE``,
    refused whole, as Synapse does)."""

    HTTP_STATUS = 400
    ERRCODE = Codes.TOO_LARGE


class IncompatibleRoomVersionError(NamedError):
    """A remote server asked to join a room whose version it does not support
    (400 ``M_INCOMPATIBLE_ROOM_VERSION``, with ``room_version``)."""

    HTTP_STATUS = 400
    ERRCODE = Codes.INCOMPATIBLE_ROOM_VERSION

    def __init__(self, message: str, *, room_version: str) -> None:
        super().__init__(message)
        self.room_version = room_version

    def to_json(self) -> dict[str, str | int]:
        body = super().to_json()
        body["room_version"] = self.room_version
        return body


class FederationForbiddenError(ForbiddenError):
    """A remote server may not see or do this: not in the room, denied by the room's
    server ACL, or acting for a user of another server (403 ``M_FORBIDDEN``)."""


class FederationEventNotFoundError(NotFoundError):
    """A remote server asked for an event, or state at an event, this server does not
    hold (404 ``M_NOT_FOUND``)."""


class UnableToAuthoriseJoinError(NamedError):
    """A restricted join this server cannot authorise: none of its users in the room may
    invite (400 ``M_UNABLE_TO_AUTHORISE_JOIN``)."""

    HTTP_STATUS = 400
    ERRCODE = Codes.UNABLE_TO_AUTHORISE_JOIN
