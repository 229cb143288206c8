"""The federation transport's errors: what a caller (and a client behind it) sees."""

from __future__ import annotations

from roomstream.errors import (
    FederationDestinationRefusedError,
    FederationRequestError,
    FederationUnreachableError,
)


def test_unreachable_and_refused() -> None:
    for cls in (FederationUnreachableError, FederationDestinationRefusedError):
        exc = cls("b.example", "connection refused")
        assert (exc.http_status, exc.errcode, exc.destination) == (502, "M_UNKNOWN", "b.example")
        assert exc.to_json() == {"errcode": "M_UNKNOWN", "error": "b.example: connection refused"}
    assert issubclass(FederationDestinationRefusedError, FederationUnreachableError)


def test_request_error_keeps_the_remote_answer() -> None:
    exc = FederationRequestError("b.example", 403, "M_FORBIDDEN", "no")
    assert (exc.status, exc.http_status, exc.errcode) == (403, 403, "M_FORBIDDEN")
    assert exc.destination == "b.example"
