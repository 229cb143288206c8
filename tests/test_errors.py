"""The one vocabulary of errors (:mod:`roomstream.errors`).

Each named error fixes its HTTP status and errcode once (checked against a table written
out here, the spec's pairs); the sources are scanned so that a status and an errcode paired
by hand, an errcode defined outside ``Codes`` or a named error defined outside
``roomstream.errors`` fails the suite.
"""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import roomstream
from roomstream import errors
from roomstream.errors import (
    AuthError,
    BadEventError,
    Codes,
    MatrixError,
    NamedError,
    NotFoundError,
    ServiceUnavailableError,
    UnknownRoomError,
)

SRC = Path(roomstream.__file__).parent

#: Every named error and the (status, errcode) it must answer with.
EXPECTED: dict[str, tuple[int, str]] = {
    "BadRequestError": (400, "M_UNKNOWN"),
    "InvalidParamError": (400, "M_INVALID_PARAM"),
    "MissingParamError": (400, "M_MISSING_PARAM"),
    "BadJsonError": (400, "M_BAD_JSON"),
    "NotJsonError": (400, "M_NOT_JSON"),
    "ThreepidAuthFailedError": (400, "M_THREEPID_AUTH_FAILED"),
    "ThreepidMediumNotSupportedError": (400, "M_THREEPID_MEDIUM_NOT_SUPPORTED"),
    "UnrecognizedRequestError": (400, "M_UNRECOGNIZED"),
    "UserInUseError": (400, "M_USER_IN_USE"),
    "InvalidUsernameError": (400, "M_INVALID_USERNAME"),
    "BadAliasError": (400, "M_BAD_ALIAS"),
    "RoomInUseError": (400, "M_ROOM_IN_USE"),
    "UnknownPosError": (400, "M_UNKNOWN_POS"),
    "MalformedEventError": (400, "M_BAD_JSON"),
    "EventNotJsonError": (400, "M_NOT_JSON"),
    "EventTooLargeError": (400, "M_TOO_LARGE"),
    "EventRoomUnknownError": (400, "M_NOT_FOUND"),
    "EventSignatureError": (400, "M_UNAUTHORIZED"),
    "UnsupportedRoomVersionError": (400, "M_UNSUPPORTED_ROOM_VERSION"),
    "MissingTokenError": (401, "M_MISSING_TOKEN"),
    "UnknownTokenError": (401, "M_UNKNOWN_TOKEN"),
    "UnauthorizedError": (401, "M_UNAUTHORIZED"),
    "ForbiddenError": (403, "M_FORBIDDEN"),
    "AuthError": (403, "M_FORBIDDEN"),
    "GuestAccessForbiddenError": (403, "M_GUEST_ACCESS_FORBIDDEN"),
    "UserDeactivatedError": (403, "M_USER_DEACTIVATED"),
    "WrongRoomKeysVersionError": (403, "M_WRONG_ROOM_KEYS_VERSION"),
    "NotFoundError": (404, "M_NOT_FOUND"),
    "EndpointDisabledError": (404, "M_UNRECOGNIZED"),
    "ConflictError": (409, "M_UNKNOWN"),
    "CannotOverwriteMediaError": (409, "M_CANNOT_OVERWRITE_MEDIA"),
    "ContentTooLargeError": (413, "M_TOO_LARGE"),
    "LimitExceededError": (429, "M_LIMIT_EXCEEDED"),
    "ResourceLimitExceededError": (400, "M_RESOURCE_LIMIT_EXCEEDED"),
    "NotYetUploadedError": (504, "M_NOT_YET_UPLOADED"),
    "StreamRowsGoneError": (410, "IO.ROOMSTREAM.STREAM_TOO_OLD"),
    "WrongWriterError": (421, "IO.ROOMSTREAM.WRONG_WRITER"),
    "InternalServerError": (500, "M_UNKNOWN"),
    "ServiceUnavailableError": (503, "M_UNAVAILABLE"),
    "FederationUnauthorizedError": (401, "M_UNAUTHORIZED"),
    "RemoteServerError": (502, "M_UNKNOWN"),
    # Federation, inbound room side (fedinbound).
    "FederationTransactionTooLargeError": (400, "M_TOO_LARGE"),
    "FederationForbiddenError": (403, "M_FORBIDDEN"),
    "FederationEventNotFoundError": (404, "M_NOT_FOUND"),
    "UnableToAuthoriseJoinError": (400, "M_UNABLE_TO_AUTHORISE_JOIN"),
}

#: Named errors built with more than a message (tested on their own below).
_SPECIAL = {
    "UnknownRoomError",
    "IncompatibleRoomVersionError",
    # (destination, message): tests/federation/test_fed_errors.py
    "FederationUnreachableError",
    "FederationDestinationRefusedError",
}
#: Abstract: only their subclasses are raised.
_ABSTRACT = {"NamedError", "BadEventError"}

#: The only places that build ``MatrixError`` itself: they map errors from elsewhere
#: (aiohttp's HTTP errors and refusals, another process's JSON error answer), so the
#: status is a variable there, never a literal. (module under src/roomstream, function)
MAPPING_PLACES = {
    ("httpbase.py", "matrix_error_middleware"),
    ("listener.py", "protocol_error"),
    ("replication/http.py", "_call"),
}

_ERRCODE = re.compile(r"M_[A-Z_]+|IO\.ROOMSTREAM\.[A-Z_]+")


def _named_errors() -> list[type[NamedError]]:
    return [
        cls
        for name, cls in vars(errors).items()
        if inspect.isclass(cls) and issubclass(cls, NamedError) and name not in _ABSTRACT | _SPECIAL
    ]


def test_every_named_error_is_in_the_table() -> None:
    """A named error added without a row here fails: its pair must be written down."""
    assert {cls.__name__ for cls in _named_errors()} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_named_error_fixes_its_status_and_errcode(name: str) -> None:
    cls = getattr(errors, name)
    exc = cls("some message")
    assert (exc.http_status, exc.errcode) == EXPECTED[name]
    assert exc.message == "some message"
    body = exc.to_json()
    assert (body["errcode"], body["error"]) == (EXPECTED[name][1], "some message")
    assert isinstance(exc, MatrixError)
    assert exc.errcode in set(Codes)


def test_event_errors_are_bad_event_errors() -> None:
    """``except BadEventError`` (the importer) catches every event refusal, all 400."""
    event_errors = [c for c in _named_errors() if issubclass(c, BadEventError)]
    assert {c.__name__ for c in event_errors} == {
        "MalformedEventError",
        "EventNotJsonError",
        "EventTooLargeError",
        "EventRoomUnknownError",
        "EventSignatureError",
        "UnsupportedRoomVersionError",
    }
    assert {c("x").http_status for c in event_errors} == {400}


def test_auth_error_is_forbidden() -> None:
    assert isinstance(AuthError("no"), errors.ForbiddenError)


def test_unknown_room_error() -> None:
    exc = UnknownRoomError("!r:hs", " (gone)")
    assert isinstance(exc, NotFoundError) and isinstance(exc, LookupError)
    assert (exc.http_status, exc.errcode, exc.message) == (
        404,
        "M_NOT_FOUND",
        "unknown room !r:hs (gone)",
    )
    assert exc.room_id == "!r:hs"


def test_service_unavailable_says_when_to_retry() -> None:
    assert ServiceUnavailableError("down").to_json() == {
        "errcode": "M_UNAVAILABLE",
        "error": "down",
        "retry_after_ms": 1000,
    }
    assert ServiceUnavailableError("down", retry_after_ms=5).retry_after_ms == 5


# -- scanning the sources ------------------------------------------------------------------


def _modules(root: Path) -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative != "errors.py":
            yield relative, ast.parse(path.read_text(), relative)


def _calls_with_function(tree: ast.Module) -> Iterator[tuple[str, ast.Call]]:
    """Every call in ``tree`` with the name of the innermost function around it."""

    def visit(node: ast.AST, function: str) -> Iterator[tuple[str, ast.Call]]:
        for child in ast.iter_child_nodes(node):
            inner = (
                child.name
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
                else function
            )
            if isinstance(child, ast.Call):
                yield function, child
            yield from visit(child, inner)

    yield from visit(tree, "")


def _constructs_matrix_error(call: ast.Call) -> bool:
    func = call.func
    return (isinstance(func, ast.Name) and func.id == "MatrixError") or (
        isinstance(func, ast.Attribute) and func.attr == "MatrixError"
    )


def hand_paired_errors(root: Path = SRC) -> list[str]:
    """``MatrixError(...)`` built outside the mapping places, or with a literal status,
    or a ``super().__init__(<status>, ...)`` in an error class (a pair by hand)."""
    found = []
    for relative, tree in _modules(root):
        for function, call in _calls_with_function(tree):
            where = f"{relative}:{call.lineno} in {function or '<module>'}"
            literal_status = bool(call.args) and isinstance(call.args[0], ast.Constant)
            by_hand = _constructs_matrix_error(call) and (
                (relative, function) not in MAPPING_PLACES or literal_status
            )
            # A subclass passing a status of its own to its base: a pair by hand too.
            init_with_status = (
                isinstance(call.func, ast.Attribute)
                and call.func.attr == "__init__"
                and literal_status
                and isinstance(call.args[0].value, int)  # type: ignore[attr-defined]
            )
            if by_hand or init_with_status:
                found.append(where)
    return found


def test_no_status_and_errcode_paired_by_hand() -> None:
    assert hand_paired_errors() == []


def test_the_scan_finds_a_pair_by_hand(tmp_path: Path) -> None:
    """The scan itself is not blind: a hand-built error in a library module is found."""
    package = tmp_path / "roomstream"
    (package / "reading").mkdir(parents=True)
    (package / "reading" / "x.py").write_text(
        "from roomstream.errors import Codes, MatrixError\n"
        "def f():\n    raise MatrixError(404, Codes.NOT_FOUND, 'no')\n"
        "class E(MatrixError):\n"
        "    def __init__(self):\n        super().__init__(400, Codes.BAD_JSON, 'x')\n"
    )
    (package / "listener.py").write_text(
        "def protocol_error(status, exc):\n    return MatrixError(status, 'M_UNKNOWN', 'x')\n"
    )
    assert hand_paired_errors(package) == ["reading/x.py:3 in f", "reading/x.py:6 in __init__"]


def test_errcodes_and_named_errors_are_defined_only_in_errors_module() -> None:
    """No errcode string constant (``"M_..."``) and no class fixing ``HTTP_STATUS`` or
    ``ERRCODE`` outside :mod:`roomstream.errors`: ``Codes`` is the one list."""
    found = []
    for relative, tree in _modules(SRC):
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and _ERRCODE.fullmatch(node.value)
            ):
                found.append(f"{relative}:{node.lineno} {node.value}")
            if isinstance(node, ast.ClassDef):
                for statement in node.body:
                    targets = (
                        statement.targets
                        if isinstance(statement, ast.Assign)
                        else [statement.target]
                        if isinstance(statement, ast.AnnAssign)
                        else []
                    )
                    for target in targets:
                        if isinstance(target, ast.Name) and target.id in (
                            "HTTP_STATUS",
                            "ERRCODE",
                        ):
                            found.append(f"{relative}:{statement.lineno} {target.id}")
    assert found == []


def test_an_incompatible_room_version_names_the_version() -> None:
    exc = errors.IncompatibleRoomVersionError("no", room_version="11")
    assert (exc.http_status, exc.to_json()) == (
        400,
        {"errcode": "M_INCOMPATIBLE_ROOM_VERSION", "error": "no", "room_version": "11"},
    )
