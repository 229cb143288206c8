"""The internal HTTP API's endpoints, each defined once.

An :class:`InternalEndpoint` is one declaration: its method and path under the internal
prefix (``POST /client/<name>`` for a forwarded Client-Server API write, else its
``route``), the stream whose writer carries it out (if any), its request (a frozen
dataclass whose annotated fields ARE the path parameters (:data:`PATH`) and the JSON body
of a POST or the query of a GET: names, JSON types, which are IDs, which are left out
when ``None``) and its answer (one ID field, the whole JSON object, or ``{}``). From it:

- :class:`~roomstream.replication.http.InternalHttpServer` registers the route, checks
  that this instance serves it, and parses and validates the request
  (:meth:`InternalEndpoint.read_path`, then :meth:`InternalEndpoint.parse`), then calls
  the handler bound to it (:meth:`InternalEndpoint.bind`: the server binds ``/health``
  and ``/streams/.../updates`` itself; the composing process binds the rest, the
  forwarded writes in :mod:`roomstream.client.forwarded`; this layer must not import the
  client layer);
- :meth:`InternalHttpClient.call <roomstream.replication.http.InternalHttpClient.call>`
  encodes a request object (:meth:`InternalEndpoint.url`, :meth:`InternalEndpoint.encode`)
  and decodes the answer. It is the one client stub of every endpoint.

Invariant: the wire format is that of every earlier release (processes of a rolling
deployment speak it): a field marked :data:`OMIT_NONE` is absent when ``None``, other
``None`` fields are sent as ``null`` (a query leaves every ``None`` out); absent and
``null`` are read alike, except that an absent field with a default other than ``None``
takes its default. Validation errors are 400 (``M_MISSING_PARAM`` for a missing field,
``M_BAD_JSON`` for a wrong JSON type (``M_MISSING_PARAM`` where marked
:data:`TYPE_MISSING`), ``M_INVALID_PARAM`` for a malformed ID or value, or a query
integer that is not one), checked path parameters first, then in field order, then by the
request's ``__post_init__`` (cross-field rules); a request with several faults is
answered for the first.

To add an endpoint: a request dataclass, an :class:`InternalEndpoint` in
:data:`CLIENT_WRITES` (a forwarded client write) or :data:`INSTANCE_ENDPOINTS`, and a
handler bound where the process is composed (for a client write, in
:mod:`roomstream.client.forwarded`).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Annotated, Any, Generic, Literal, TypeVar, cast
from urllib.parse import quote, urlencode

from roomstream.errors import (
    BadJsonError,
    InvalidParamError,
    MatrixError,
    MissingParamError,
    NamedError,
    UnrecognizedRequestError,
    WrongWriterError,
)
from roomstream.grammar import is_opaque_id, is_room_id_to_look_up, is_server_name, is_user_id

__all__ = [
    "ACCOUNT_DATA",
    "CLIENT_WRITES",
    "CREATE_NAMED_ROOM",
    "CREATE_ROOM",
    "DEVICE_PUSHERS",
    "E2E_KEYS",
    "END_SESSIONS",
    "FEDERATION_ROOM",
    "FEDERATION_ROOM_OPS",
    "HEALTH",
    "INSTANCE_ENDPOINTS",
    "MAX_UPDATES_LIMIT",
    "OMIT_NONE",
    "PATH",
    "PRESENCE",
    "PRESENCE_STATES",
    "PUSHER",
    "PUSH_RULE_EDIT",
    "PUSH_RULE_OPS",
    "RECEIPT",
    "REMOTE_JOIN",
    "SEND",
    "SEND_EVENT",
    "STREAM_UPDATES",
    "TO_DEVICE",
    "TYPE_MISSING",
    "TYPING",
    "WHOLE",
    "AccountDataCall",
    "BoundEndpoint",
    "CreateNamedRoomCall",
    "CreateRoomCall",
    "DevicePushersCall",
    "E2eKeysCall",
    "EndSessionsCall",
    "FederationRoomCall",
    "HealthCall",
    "Id",
    "InternalEndpoint",
    "PresenceCall",
    "PushRuleEditCall",
    "PusherCall",
    "ReceiptCall",
    "RemoteJoinCall",
    "SendCall",
    "SendEventCall",
    "StreamUpdatesCall",
    "ToDeviceCall",
    "TypingCall",
    "Wire",
    "read_field",
    "read_identifier",
    "read_query_int",
]


T = TypeVar("T")


def read_field(
    body: Mapping[str, Any],
    name: str,
    kind: type[T],
    *,
    optional: bool = False,
    type_error: type[NamedError] = BadJsonError,
) -> T:
    """``body[name]`` of JSON type ``kind`` (``None`` when optional and absent); a value
    of another type is ``type_error``."""
    value = body.get(name)
    if value is None:
        if optional:
            return None  # type: ignore[return-value]
        raise MissingParamError(f"{name} is required")
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise type_error(f"{name} must be a {kind.__name__}")
    return value


def read_identifier(
    body: Mapping[str, Any],
    name: str,
    *,
    sigil: str = "",
    optional: bool = False,
    type_error: type[NamedError] = BadJsonError,
    check: Callable[[str], bool] | None = None,
) -> str:
    """A string field that is an ID or type (:func:`~roomstream.grammar.is_opaque_id`),
    starting with ``sigil`` (and passing ``check``, a stricter grammar, if given)."""
    value = read_field(body, name, str, optional=optional, type_error=type_error)
    if value is not None and (
        not is_opaque_id(value)
        or not value.startswith(sigil)
        or (check is not None and not check(value))
    ):
        raise InvalidParamError(f"{name} is not a valid ID: {value[:300]!r}")
    return value


def read_query_int(query: Mapping[str, str], name: str) -> int | None:
    """A query parameter that is a decimal integer (an optional ``-``, at most 20
    characters in all), or None when absent; 400 ``M_INVALID_PARAM`` otherwise."""
    raw = query.get(name)
    if raw is None:
        return None
    digits = raw[1:] if raw.startswith("-") else raw
    if not digits.isascii() or not digits.isdigit() or len(raw) > 20:
        raise InvalidParamError(f"{name} must be an integer")
    return int(raw)


# -- field annotations ----------------------------------------------------------------


@dataclass(frozen=True)
class Id:
    """Annotates a ``str`` field that is an ID or event type (:func:`read_identifier`);
    ``check``: a stricter grammar it must also pass."""

    sigil: str = ""
    check: Callable[[str], bool] | None = None


@dataclass(frozen=True)
class Wire:
    """Annotates a field whose name on the wire is not its Python name (``from``)."""

    name: str


class _Marker:
    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


#: Annotates an optional field the body leaves out (rather than sending ``null``) when None.
OMIT_NONE = _Marker("OMIT_NONE")
#: Annotates a field read from the route's path (``{name}`` in it), not the body or query.
PATH = _Marker("PATH")
#: Annotates a field whose value of a wrong JSON type is answered 400 ``M_MISSING_PARAM``
#: rather than ``M_BAD_JSON``: the first routes (``send_event``, ``create_room``) always
#: answered so, and their wire format is kept.
TYPE_MISSING = _Marker("TYPE_MISSING")


class _Whole:
    def __repr__(self) -> str:
        return "WHOLE"


#: An endpoint's ``answer``: the whole JSON object the handler returns (a ``dict``).
WHOLE = _Whole()

UserId = Annotated[str, Id("@")]
RoomId = Annotated[str, Id("!")]
Identifier = Annotated[str, Id()]

Source = Literal["body", "query", "path"]


@dataclass(frozen=True)
class _Param:
    """One field of a request, read off its dataclass annotation: from the path, the
    JSON body (POST) or the query (GET)."""

    name: str
    wire: str
    source: Source
    kind: type
    optional: bool
    id: Id | None
    omit_none: bool
    type_error: type[NamedError]
    #: Makes the dataclass default (a fresh one per request: it may be a dict), taken
    #: when the field is absent; None for no default other than None.
    default: Callable[[], Any] | None

    def read(self, values: Mapping[str, Any]) -> Any:
        if self.default is not None:
            if self.wire not in values:
                return self.default()
            if values[self.wire] is None:  # only absence means the default
                raise self.type_error(f"{self.wire} must be a {self.kind.__name__}")
        if self.source == "query" and self.kind is int:
            number = read_query_int(values, self.wire)
            if number is None and not self.optional:
                raise MissingParamError(f"missing query parameter {self.wire}")
            return number
        if self.id is not None:
            return read_identifier(
                values,
                self.wire,
                sigil=self.id.sigil,
                optional=self.optional,
                type_error=self.type_error,
                check=self.id.check,
            )
        return read_field(
            values, self.wire, self.kind, optional=self.optional, type_error=self.type_error
        )


def _same(value: T) -> T:
    return value


def _params(request: type, method: str) -> tuple[_Param, ...]:
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
        source: Source = "path" if PATH in extras else "body" if method == "POST" else "query"
        allowed = {"path": (str,), "query": (str, int), "body": (str, int, bool, dict, list)}[
            source
        ]
        assert kind in allowed, f"{request.__name__}.{f.name}: {hint} in the {source}"
        ident: Id | None = next((e for e in extras if isinstance(e, Id)), None)
        wire = next((e.name for e in extras if isinstance(e, Wire)), f.name)
        default: Callable[[], Any] | None = None  # a default of None: absent is null
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory
        elif f.default is not dataclasses.MISSING and f.default is not None:
            default = functools.partial(_same, f.default)
        type_error = MissingParamError if TYPE_MISSING in extras else BadJsonError
        omit = OMIT_NONE in extras
        params.append(
            _Param(f.name, wire, source, kind, optional, ident, omit, type_error, default)
        )
    return tuple(params)


# -- endpoints ------------------------------------------------------------------------

Req = TypeVar("Req")
Resp = TypeVar("Resp")


@dataclass(frozen=True, eq=False)
class InternalEndpoint(Generic[Req, Resp]):
    """``method`` ``route`` (default ``POST /client/<name>``, a forwarded Client-Server
    API write), carried out by a writer of ``stream`` (None: by any instance).

    ``answer``: the one field of the answer (the handler returns its value),
    :data:`WHOLE` (the handler returns the answer's JSON object), or None for ``{}`` (the
    handler returns None). ``room_owned``: the request's ``room_id`` must hash to the
    receiving instance among the stream's writers; else 421, no second hop, unless
    ``forwards``: then an instance that is not the owner (or has no handler bound)
    forwards the request once to the owner. ``unserved``: the error of an instance that
    does not write ``stream`` or has no handler bound, answered before the request is
    read (421 ``WRONG_WRITER`` by default).
    """

    name: str
    stream: str | None
    request: type[Req]
    answer: str | _Whole | None = None
    room_owned: bool = False
    route: str | None = None
    method: Literal["GET", "POST"] = "POST"
    forwards: bool = False
    unserved: type[NamedError] = WrongWriterError

    @property
    def path(self) -> str:
        """Under the internal API's prefix; ``{name}`` stands for a :data:`PATH` field."""
        return f"/client/{self.name}" if self.route is None else self.route

    @cached_property
    def _params(self) -> tuple[_Param, ...]:
        return _params(self.request, self.method)

    def read_path(self, match_info: Mapping[str, str]) -> dict[str, Any]:
        """The :data:`PATH` fields (by name) in a request's path parameters; 400
        MatrixError for one that is not valid. The server reads them before the body."""
        return {p.name: p.read(match_info) for p in self._params if p.source == "path"}

    def parse(self, values: Mapping[str, Any], path: Mapping[str, str] | None = None) -> Req:
        """The request in a JSON body (POST) or query (GET) and the path parameters; 400
        MatrixError for a request that is not one."""
        path = path or {}
        return self.request(
            **{p.name: p.read(path if p.source == "path" else values) for p in self._params}
        )

    def url(self, request: Req) -> str:
        """The path (path parameters quoted) and, for a GET, the query of ``request``."""
        path = self.path.format(
            **{
                p.name: quote(getattr(request, p.name), safe="")
                for p in self._params
                if p.source == "path"
            }
        )
        if self.method == "GET":
            query = [
                (p.wire, str(getattr(request, p.name)))
                for p in self._params
                if p.source == "query" and getattr(request, p.name) is not None
            ]
            if query:
                path += "?" + urlencode(query)
        return path

    def encode(self, request: Req) -> dict[str, Any] | None:
        """The JSON body of ``request`` (None for a GET: it has none)."""
        if self.method == "GET":
            return None
        body = {}
        for p in self._params:
            if p.source != "body":
                continue
            value = getattr(request, p.name)
            if value is not None or not p.omit_none:
                body[p.wire] = value
        return body

    def encode_answer(self, result: Resp) -> Any:
        if self.answer is None:
            return {}
        if isinstance(self.answer, _Whole):
            return result
        return {self.answer: result}

    def decode_answer(self, payload: Any) -> Resp:
        if self.answer is None:
            return cast(Resp, None)
        if isinstance(self.answer, _Whole):
            return cast(Resp, payload)
        return cast(Resp, payload[self.answer])

    def bind(
        self,
        handler: Callable[[Req], Awaitable[Resp]],
        *,
        check: Callable[[Mapping[str, Any]], None] | None = None,
    ) -> BoundEndpoint[Req, Resp]:
        """This endpoint served by ``handler`` (on a process that writes ``stream``).
        ``check``: given the :data:`PATH` fields, raises the MatrixError of a request this
        process does not serve (say 404 for stream rows it does not hold), before the body
        or query is read."""
        return BoundEndpoint(self, handler, check)


@dataclass(frozen=True)
class BoundEndpoint(Generic[Req, Resp]):
    endpoint: InternalEndpoint[Req, Resp]
    handler: Callable[[Req], Awaitable[Resp]]
    check: Callable[[Mapping[str, Any]], None] | None = None


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
    """Log a device out (all of the user's without ``device_id``; with ``keep_device``,
    all but that device and, of its tokens, the one hashed ``keep_token``: a password
    change)."""

    user_id: UserId
    device_id: str | None = None
    keep_device: Annotated[str | None, OMIT_NONE] = None
    keep_token: Annotated[str | None, OMIT_NONE] = None


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
    #: When the receipt was made (ms since the epoch), if not now: another server's.
    ts: Annotated[int | None, OMIT_NONE] = None


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

#: The presence states a client may set (roomstream.client.presence.PRESENCE_STATES).
PRESENCE_STATES = ("online", "unavailable", "offline")


@dataclass(frozen=True)
class PresenceCall:
    """A device's presence for the presence writer: ``PUT /presence/{userId}/status``
    (``status_msg`` None clears it), or a sync's ``set_presence`` (``is_sync``)."""

    user_id: UserId
    presence: Identifier
    device_id: Annotated[str | None, OMIT_NONE] = None
    status_msg: Annotated[str | None, OMIT_NONE] = None
    is_sync: bool = False

    def __post_init__(self) -> None:
        if self.presence not in PRESENCE_STATES:
            raise InvalidParamError("presence: online|unavailable|offline")


PRESENCE = InternalEndpoint[PresenceCall, None]("presence", "presence", PresenceCall)


@dataclass(frozen=True)
class PusherCall:
    """``POST /pushers/set`` for the pushers writer: the user, the request's body
    (validated again there) and the requester's device (absent from earlier releases:
    the pusher has no device)."""

    user_id: UserId
    body: dict[str, Any]
    device_id: Annotated[str | None, OMIT_NONE, Id()] = None


PUSHER = InternalEndpoint[PusherCall, None]("pusher", "pushers", PusherCall)


@dataclass(frozen=True)
class DevicePushersCall:
    """A device of the user was deleted (logged out): the pushers writer removes the
    pushers it set."""

    user_id: UserId
    device_id: Identifier


DEVICE_PUSHERS = InternalEndpoint[DevicePushersCall, None](
    "device_pushers_removed", "pushers", DevicePushersCall
)

#: Edits of a user's push rules (roomstream.client.pushrules.PushRuleEdit.op).
PUSH_RULE_OPS = ("put", "delete", "enabled", "actions")


@dataclass(frozen=True)
class PushRuleEditCall:
    """An edit of a user's push rules for the ``push_rules`` writer: ``op`` on rule
    ``rule_id`` of ``kind`` with the request's body (``{}`` for a deletion), placed by
    ``before``/``after`` (a new or replaced rule); the rule itself is checked there."""

    user_id: UserId
    op: Identifier
    kind: Identifier
    rule_id: str
    body: dict[str, Any]
    before: Annotated[str | None, OMIT_NONE] = None
    after: Annotated[str | None, OMIT_NONE] = None

    def __post_init__(self) -> None:
        if self.op not in PUSH_RULE_OPS:
            raise InvalidParamError(f"op: {'|'.join(PUSH_RULE_OPS)}")


PUSH_RULE_EDIT = InternalEndpoint[PushRuleEditCall, None](
    "push_rule_edit", "push_rules", PushRuleEditCall
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
    PRESENCE,
    PUSHER,
    PUSH_RULE_EDIT,
    DEVICE_PUSHERS,
)


# -- the instance's own endpoints -----------------------------------------------------

#: The most rows one ``/updates`` request may ask for.
MAX_UPDATES_LIMIT = 10_000


@dataclass(frozen=True)
class HealthCall:
    """``GET /health``: liveness and the process's replication status; no parameters."""


@dataclass(frozen=True, kw_only=True)
class StreamUpdatesCall:
    """``GET /streams/{stream}/updates?writer=&from=&upto=&limit=``: rows of an in-memory
    stream (typing) that the instance writes, with the ``get_updates`` contract; a reader
    that fell behind fetches them here. ``writer`` (default: the instance asked) must be
    that instance; ``upto`` defaults to its current token."""

    stream: Annotated[str, PATH]
    writer: str | None = None
    from_token: Annotated[int, Wire("from")]
    upto: int | None = None
    limit: int = 1000

    def __post_init__(self) -> None:
        if not 1 <= self.limit <= MAX_UPDATES_LIMIT:
            raise InvalidParamError(f"limit must be in 1..{MAX_UPDATES_LIMIT}")


@dataclass(frozen=True)
class SendEventCall:
    """``POST /rooms/{room_id}/send_event``: create and persist an event as ``sender``
    (``redacts``: the redacted event of an ``m.room.redaction``, top-level in room
    version 10, moved into the content from 11 by the owner's event builder). The
    instance that owns the room persists it; any other forwards the request once.

    ``content`` absent is ``{}`` (``null`` is refused); ``state_key`` and ``redacts``
    are left out of the body when None."""

    room_id: Annotated[str, PATH, Id("!", check=is_room_id_to_look_up)]
    sender: Annotated[str, Id("@", check=is_user_id), TYPE_MISSING]
    type: Annotated[str, Id(), TYPE_MISSING]
    content: dict[str, Any] = field(default_factory=dict)
    state_key: Annotated[str | None, OMIT_NONE] = None
    redacts: Annotated[str | None, Id("$"), OMIT_NONE] = None

    def __post_init__(self) -> None:
        if self.state_key is not None and "\x00" in self.state_key:
            raise InvalidParamError("state_key must not contain NUL")


@dataclass(frozen=True)
class CreateNamedRoomCall:
    """``POST /create_room``: a public-chat room created by ``creator`` on the instance
    asked (an events writer), named ``name``; answers its ``room_id``."""

    creator: Annotated[str, TYPE_MISSING]
    name: Annotated[str | None, TYPE_MISSING] = None


#: What a federation listener hands to a room's events writer (:class:`FederationRoomCall`):
#: ``pdus`` (a transaction's PDUs of the room, ``args["pdus"]``), the membership templates
#: (``make_join``, ``make_leave``, ``make_knock``: ``args["user_id"]``, ``args["ver"]``), the
#: signed membership events (``send_join``, ``send_leave``, ``send_knock``:
#: ``args["event_id"]``, ``args["pdu"]``) and ``invite`` (``args["event_id"]``,
#: ``args["body"]``, the request's whole body).
FEDERATION_ROOM_OPS = (
    "pdus",
    "make_join",
    "make_leave",
    "make_knock",
    "send_join",
    "send_leave",
    "send_knock",
    "invite",
)


@dataclass(frozen=True)
class FederationRoomCall:
    """``POST /rooms/{room_id}/federation``: a request of another server (``origin``,
    already authenticated by the federation listener that received it) about a room,
    carried out by the room's events writer: the one process whose persister holds the
    room, so the one that may build on its extremities and persist its events. ``op``
    (one of :data:`FEDERATION_ROOM_OPS`) names the request, ``args`` its parameters
    (checked by the writer's federation server, as those of the request received); the
    answer is the Server-Server API's answer body."""

    room_id: Annotated[str, PATH, Id("!", check=is_room_id_to_look_up)]
    origin: Annotated[str, Id(check=is_server_name)]
    op: Identifier
    args: dict[str, Any]

    def __post_init__(self) -> None:
        if self.op not in FEDERATION_ROOM_OPS:
            raise InvalidParamError(f"op: {'|'.join(FEDERATION_ROOM_OPS)}")


@dataclass(frozen=True)
class RemoteJoinCall:
    """``POST /rooms/{room_id}/remote_join``: join local user ``user_id`` to a room of other
    servers (``make_join``/``send_join`` through the first of ``servers`` that lets it),
    on the events writer the room ID hashes to, which persists the room's state and the
    join (the room is unknown here, so its owner is the one the sharding rule names)."""

    room_id: Annotated[str, PATH, Id("!", check=is_room_id_to_look_up)]
    user_id: UserId
    servers: list[str]
    content: dict[str, Any]

    def __post_init__(self) -> None:
        if not all(isinstance(s, str) and is_server_name(s) for s in self.servers):
            raise InvalidParamError("servers: a list of server names")


HEALTH = InternalEndpoint[HealthCall, dict[str, Any]](
    "health", None, HealthCall, answer=WHOLE, route="/health", method="GET"
)
STREAM_UPDATES = InternalEndpoint[StreamUpdatesCall, dict[str, Any]](
    "updates",
    None,
    StreamUpdatesCall,
    answer=WHOLE,
    route="/streams/{stream}/updates",
    method="GET",
)
SEND_EVENT = InternalEndpoint[SendEventCall, dict[str, Any]](
    "send_event",
    "events",
    SendEventCall,
    answer=WHOLE,
    room_owned=True,
    route="/rooms/{room_id}/send_event",
    forwards=True,
)
CREATE_NAMED_ROOM = InternalEndpoint[CreateNamedRoomCall, str](
    "create_named_room",
    "events",
    CreateNamedRoomCall,
    answer="room_id",
    route="/create_room",
    unserved=UnrecognizedRequestError,
)

FEDERATION_ROOM = InternalEndpoint[FederationRoomCall, dict[str, Any]](
    "federation_room",
    "events",
    FederationRoomCall,
    answer=WHOLE,
    room_owned=True,
    route="/rooms/{room_id}/federation",
)
REMOTE_JOIN = InternalEndpoint[RemoteJoinCall, None](
    "remote_join",
    "events",
    RemoteJoinCall,
    room_owned=True,
    route="/rooms/{room_id}/remote_join",
)

#: The endpoints of the instance itself (the first routes of the internal API): the
#: server binds the first two, the composing process the events writes and federation's
#: room requests (on a process with federation).
INSTANCE_ENDPOINTS: tuple[InternalEndpoint[Any, Any], ...] = (
    HEALTH,
    STREAM_UPDATES,
    SEND_EVENT,
    CREATE_NAMED_ROOM,
    FEDERATION_ROOM,
    REMOTE_JOIN,
)
