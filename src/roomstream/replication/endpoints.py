"""The internal HTTP API's forwarded Client-Server API writes, each defined once.

An :class:`InternalEndpoint` is one declaration: its path (``POST /client/<name>`` under
the internal prefix), the stream whose writer carries it out, its request (a frozen
dataclass whose annotated fields ARE the JSON body: names, JSON types, which are IDs,
which are left out when ``None``) and its answer (one ID field, or ``{}``). From it:

- :class:`~roomstream.replication.http.InternalHttpServer` registers the route and parses
  and validates the body (:meth:`InternalEndpoint.parse`), then calls the handler the
  composing process bound to it (:meth:`InternalEndpoint.bind`, done by
  :mod:`roomstream.client.forwarded`; this layer must not import the client layer);
- :meth:`InternalHttpClient.call <roomstream.replication.http.InternalHttpClient.call>`
  encodes a request object (:meth:`InternalEndpoint.encode`) and decodes the answer.

Invariant: the wire format is that of every earlier release (processes of a rolling
deployment speak it): a field marked :data:`OMIT_NONE` is absent when ``None``, other
``None`` fields are sent as ``null``; absent and ``null`` are read alike. Validation
errors are 400 (``M_MISSING_PARAM`` for a missing field, ``M_BAD_JSON`` for a wrong JSON
type, ``M_INVALID_PARAM`` for a malformed ID or value), checked in field order and then
by the request's ``__post_init__`` (cross-field rules).

To add an endpoint: a request dataclass, an :class:`InternalEndpoint` in
:data:`CLIENT_WRITES`, and a handler bound in :mod:`roomstream.client.forwarded`.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Annotated, Any, Generic, TypeVar, cast

from roomstream.errors import BadJsonError, InvalidParamError, MatrixError, MissingParamError
from roomstream.grammar import is_opaque_id

__all__ = [
    "ACCOUNT_DATA",
    "CLIENT_WRITES",
    "CREATE_ROOM",
    "E2E_KEYS",
    "END_SESSIONS",
    "OMIT_NONE",
    "RECEIPT",
    "SEND",
    "TO_DEVICE",
    "TYPING",
    "AccountDataCall",
    "BoundEndpoint",
    "CreateRoomCall",
    "E2eKeysCall",
    "EndSessionsCall",
    "Id",
    "InternalEndpoint",
    "ReceiptCall",
    "SendCall",
    "ToDeviceCall",
    "TypingCall",
    "read_field",
    "read_identifier",
]


T = TypeVar("T")


def read_field(body: dict[str, Any], name: str, kind: type[T], *, optional: bool = False) -> T:
    """``body[name]`` of JSON type ``kind`` (``None`` when optional and absent)."""
    value = body.get(name)
    if value is None:
        if optional:
            return None  # type: ignore[return-value]
        raise MissingParamError(f"{name} is required")
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise BadJsonError(f"{name} must be a {kind.__name__}")
    return value


def read_identifier(
    body: dict[str, Any], name: str, *, sigil: str = "", optional: bool = False
) -> str:
    """A string field that is an ID or type (:func:`~roomstream.grammar.is_opaque_id`),
    starting with ``sigil``."""
    value = read_field(body, name, str, optional=optional)
    if value is not None and (not is_opaque_id(value) or not value.startswith(sigil)):
        raise InvalidParamError(f"{name} is not a valid ID: {value[:300]!r}")
    return value


# -- field annotations ----------------------------------------------------------------


@dataclass(frozen=True)
class Id:
    """Annotates a ``str`` field that is an ID or event type (:func:`read_identifier`)."""

    sigil: str = ""


class _OmitNone:
    def __repr__(self) -> str:
        return "OMIT_NONE"


#: Annotates an optional field the body leaves out (rather than sending ``null``) when None.
OMIT_NONE = _OmitNone()

UserId = Annotated[str, Id("@")]
RoomId = Annotated[str, Id("!")]
Identifier = Annotated[str, Id()]


@dataclass(frozen=True)
class _Param:
    """One JSON field of a request, read off its dataclass annotation."""

    name: str
    kind: type
    optional: bool
    id: Id | None
    omit_none: bool

    def read(self, body: dict[str, Any]) -> Any:
        if self.id is not None:
            return read_identifier(body, self.name, sigil=self.id.sigil, optional=self.optional)
        return read_field(body, self.name, self.kind, optional=self.optional)


def _params(request: type) -> tuple[_Param, ...]:
    hints = typing.get_type_hints(request, include_extras=True)
    params = []
    for f in fields(request):
        hint = hints[f.name]
        extras: tuple[Any, ...] = ()
        if typing.get_origin(hint) is Annotated:
            hint, *rest = typing.get_args(hint)
            extras = tuple(rest)
        optional = False
        if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
            members = [a for a in typing.get_args(hint) if a is not type(None)]
            optional, (hint,) = True, members
        if typing.get_origin(hint) is Annotated:  # Annotated[str, Id()] | None
            hint, *rest = typing.get_args(hint)
            extras += tuple(rest)
        kind = typing.get_origin(hint) or hint
        assert kind in (str, int, bool, dict), f"{request.__name__}.{f.name}: {hint}"
        ident: Id | None = next((e for e in extras if isinstance(e, Id)), None)
        params.append(_Param(f.name, kind, optional, ident, OMIT_NONE in extras))
    return tuple(params)


# -- endpoints ------------------------------------------------------------------------

Req = TypeVar("Req")
Resp = TypeVar("Resp")


@dataclass(frozen=True, eq=False)
class InternalEndpoint(Generic[Req, Resp]):
    """``POST /client/<name>``: a write of ``stream`` carried out by its writer.

    ``answer``: the one field of the answer (the handler returns its string value), or
    None for ``{}`` (the handler returns None). ``room_owned``: the request's ``room_id``
    must hash to the receiving instance among the stream's writers (else 421, no second
    hop).
    """

    name: str
    stream: str
    request: type[Req]
    answer: str | None = None
    room_owned: bool = False

    @property
    def path(self) -> str:
        """Under the internal API's prefix."""
        return f"/client/{self.name}"

    @cached_property
    def _params(self) -> tuple[_Param, ...]:
        return _params(self.request)

    def parse(self, body: dict[str, Any]) -> Req:
        """The request in a JSON body; 400 MatrixError for a body that is not one."""
        return self.request(**{p.name: p.read(body) for p in self._params})

    def encode(self, request: Req) -> dict[str, Any]:
        """The JSON body of ``request``."""
        body = {}
        for p in self._params:
            value = getattr(request, p.name)
            if value is not None or not p.omit_none:
                body[p.name] = value
        return body

    def encode_answer(self, result: Resp) -> dict[str, Any]:
        return {} if self.answer is None else {self.answer: result}

    def decode_answer(self, payload: Any) -> Resp:
        if self.answer is None:
            return cast(Resp, None)
        return cast(Resp, payload[self.answer])

    def bind(self, handler: Callable[[Req], Awaitable[Resp]]) -> BoundEndpoint[Req, Resp]:
        """This endpoint served by ``handler`` (on a process that writes ``stream``)."""
        return BoundEndpoint(self, handler)


@dataclass(frozen=True)
class BoundEndpoint(Generic[Req, Resp]):
    endpoint: InternalEndpoint[Req, Resp]
    handler: Callable[[Req], Awaitable[Resp]]


@dataclass(frozen=True)
class CreateRoomCall:
    """A whole ``createRoom`` request body, created exactly as a local one."""

    creator: UserId
    request: dict[str, Any]


@dataclass(frozen=True)
class SendCall:
    """A client's idempotent send (``PUT /send``, ``/redact``); the room's owner alone
    decides whether the transaction ID was used already."""

    room_id: RoomId
    user_id: UserId
    device_id: str
    txn_id: str
    type: Identifier
    content: dict[str, Any]
    redacts: Annotated[str | None, Id("$"), OMIT_NONE] = None


@dataclass(frozen=True)
class EndSessionsCall:
    """Log a device out (all of the user's without ``device_id``)."""

    user_id: UserId
    device_id: str | None = None


@dataclass(frozen=True)
class AccountDataCall:
    user_id: UserId
    room_id: Annotated[str | None, Id("!")]
    type: Identifier
    content: dict[str, Any]


@dataclass(frozen=True)
class ReceiptCall:
    room_id: RoomId
    receipt_type: Identifier
    user_id: UserId
    event_id: Identifier
    thread_id: Annotated[str | None, Id()] = None


def _bad_messages() -> MatrixError:
    return BadJsonError("messages: user -> device -> object")


@dataclass(frozen=True)
class ToDeviceCall:
    """To-device messages (user -> device -> content); with a transaction (sending device
    and transaction ID, both or neither) queued once per transaction."""

    sender: UserId
    type: Identifier
    messages: dict[str, Any]
    sender_device: Annotated[str | None, OMIT_NONE] = None
    txn_id: Annotated[str | None, OMIT_NONE] = None

    def __post_init__(self) -> None:
        for user_id, by_device in self.messages.items():
            if not is_opaque_id(user_id) or not isinstance(by_device, dict):
                raise _bad_messages()
            for device_id, content in by_device.items():
                if not is_opaque_id(device_id) or not isinstance(content, dict):
                    raise _bad_messages()
        if self.txn_id is not None and self.sender_device is None:
            raise MissingParamError("sender_device is required")

    @property
    def transaction(self) -> tuple[str, str] | None:
        """(sending device, transaction ID), if the sender gave one."""
        if self.txn_id is None or self.sender_device is None:
            return None
        return self.sender_device, self.txn_id


@dataclass(frozen=True)
class TypingCall:
    room_id: RoomId
    user_id: UserId
    typing: bool
    timeout: int

    def __post_init__(self) -> None:
        if not 0 <= self.timeout <= 2**53:
            raise InvalidParamError("timeout must be a non-negative integer")


CREATE_ROOM = InternalEndpoint[CreateRoomCall, str](
    "create_room", "events", CreateRoomCall, answer="room_id"
)
SEND = InternalEndpoint[SendCall, str](
    "send", "events", SendCall, answer="event_id", room_owned=True
)
END_SESSIONS = InternalEndpoint[EndSessionsCall, None]("end_sessions", "caches", EndSessionsCall)
ACCOUNT_DATA = InternalEndpoint[AccountDataCall, None](
    "account_data", "account_data", AccountDataCall
)
RECEIPT = InternalEndpoint[ReceiptCall, None]("receipt", "receipts", ReceiptCall)
TO_DEVICE = InternalEndpoint[ToDeviceCall, None]("to_device", "to_device", ToDeviceCall)
TYPING = InternalEndpoint[TypingCall, None]("typing", "typing", TypingCall)


@dataclass(frozen=True)
class E2eKeysCall:
    """An end-to-end-keys write that adds a ``device_lists`` row (``op`` names it, its
    ``args`` are checked by :meth:`roomstream.e2e.E2eKeys.perform`)."""

    op: Identifier
    args: dict[str, Any]


E2E_KEYS = InternalEndpoint[E2eKeysCall, Any](
    "e2e_keys", "device_lists", E2eKeysCall, answer="result"
)

#: Every forwarded Client-Server API write; the internal server registers each.
CLIENT_WRITES: tuple[InternalEndpoint[Any, Any], ...] = (
    CREATE_ROOM,
    SEND,
    END_SESSIONS,
    ACCOUNT_DATA,
    RECEIPT,
    TO_DEVICE,
    TYPING,
    E2E_KEYS,
)
