"""Replication wire commands: one immutable class per command, a parser and a serializer.

No I/O happens here. The format is the line-based protocol Synapse speaks between its
processes (over TCP, and over Redis pub/sub): ``NAME`` followed by a single space and the
command's arguments, one command per line. See ``docs/replication.md``, "Wire format".

Invariants:

- ``parse_line(serialize(cmd)) == cmd`` for every command ``serialize`` accepts, and
  ``serialize`` emits byte-for-byte what Synapse emits for the same command (same field
  order, ``NAME + " " + args`` even when args are empty, compact JSON with
  ``ensure_ascii``), so a line from either side parses in the other.
- ``parse_line`` raises nothing but ``ProtocolError``, whatever the input; the error's
  ``reason`` is one short line that fits in an ``ERROR`` command.

Commands are tuple subclasses with empty ``__slots__`` (typed ``NamedTuple`` fields):
immutable, no per-instance ``__dict__``, and the parser builds them with
``tuple.__new__``, which is measurably cheaper than a frozen dataclass' ``__init__`` on
the hot RDATA path. Equality and hashing include the command type, so
``PingCommand("x") != ErrorCommand("x")`` even though both are one-field tuples.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Any, ClassVar, NamedTuple, TypeAlias

import orjson

from roomstream.exactjson import DIGITS_TO_ZERO, has_long_digit_run

__all__ = [
    "ALL_COMMAND_NAMES",
    "CLIENT_COMMANDS",
    "DEFAULT_MAX_LINE_LENGTH",
    "SENDERS",
    "SERVER_COMMANDS",
    "BaseCommand",
    "CancelTaskCommand",
    "ClearUserSyncCommand",
    "Command",
    "ErrorCommand",
    "FederationAckCommand",
    "JsonValue",
    "LineTooLongError",
    "LockReleasedCommand",
    "NameCommand",
    "NewActiveTaskCommand",
    "PingCommand",
    "PositionCommand",
    "ProtocolError",
    "RdataCommand",
    "RemoteServerUpCommand",
    "ReplicateCommand",
    "ReplicateStreamCommand",
    "ServerCommand",
    "Side",
    "UserIpCommand",
    "UserSyncCommand",
    "may_send",
    "parse_line",
    "serialize",
]

#: Longest accepted line in bytes, not counting the ``\n``. Synapse's TCP protocol is a
#: Twisted ``LineOnlyReceiver`` with the default ``MAX_LENGTH`` of 16384: it drops the
#: connection on a longer incoming line and refuses to send one. Accepting more would
#: let us emit lines Synapse rejects; accepting less would reject lines it sends. It also
#: bounds what one peer can make us buffer before a newline arrives.
DEFAULT_MAX_LINE_LENGTH = 16384

#: A decoded JSON value (the ``row`` of an RDATA is whatever the stream defines).
JsonValue: TypeAlias = Any

# Longest reason we put in an ERROR line: enough to be useful, never near the limit.
_MAX_REASON_LENGTH = 400


class ProtocolError(Exception):
    """The peer sent something the protocol does not allow.

    ``reason`` is a single line (no CR/LF, at most a few hundred characters) suitable as
    the argument of the ``ERROR`` command sent back before closing the connection.
    """

    def __init__(self, reason: str) -> None:
        reason = reason.replace("\r", "\\r").replace("\n", "\\n")
        if len(reason) > _MAX_REASON_LENGTH:
            reason = reason[: _MAX_REASON_LENGTH - 3] + "..."
        super().__init__(reason)
        self.reason = reason


class LineTooLongError(ValueError):
    """``serialize`` refused a command whose line is over the length limit."""


class Side(StrEnum):
    """Which end of a TCP replication connection a process is."""

    SERVER = "server"
    CLIENT = "client"


class BaseCommand:
    """Behaviour shared by all commands; every concrete command also derives from a tuple.

    ``NAME`` is the command word on the wire.
    """

    __slots__ = ()
    NAME: ClassVar[str]

    def __eq__(self, other: object) -> bool:
        # Plain tuple equality would make commands of different types (or a bare tuple)
        # equal when their fields match.
        return type(self) is type(other) and tuple.__eq__(self, other)  # type: ignore[operator]

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash((self.NAME, tuple.__hash__(self)))  # type: ignore[arg-type]


# Field layouts. Kept separate from the command classes because a NamedTuple body may
# only declare fields, and every command needs the ``NAME`` class constant too.


class _Server(NamedTuple):
    server_name: str


class _Rdata(NamedTuple):
    stream_name: str
    instance_name: str
    token: int | None
    row: JsonValue


class _Position(NamedTuple):
    stream_name: str
    instance_name: str
    prev_token: int
    new_token: int


class _Error(NamedTuple):
    message: str


class _Ping(NamedTuple):
    data: str


class _Name(NamedTuple):
    client_name: str


class _Replicate(NamedTuple):
    pass


class _ReplicateStream(NamedTuple):
    stream_name: str
    token: int | None


class _UserSync(NamedTuple):
    instance_id: str
    user_id: str
    device_id: str | None
    is_syncing: bool
    last_sync_ms: int


class _ClearUserSync(NamedTuple):
    instance_id: str


class _FederationAck(NamedTuple):
    instance_name: str
    token: int


class _RemoteServerUp(NamedTuple):
    server_name: str


class _UserIp(NamedTuple):
    user_id: str
    access_token: str
    ip: str
    user_agent: str
    device_id: str | None
    last_seen: int


class _LockReleased(NamedTuple):
    instance_name: str
    lock_name: str
    lock_key: str


class _TaskId(NamedTuple):
    task_id: str


class ServerCommand(BaseCommand, _Server):
    """``SERVER <server_name>``: the server's identity, sent first on a new connection."""

    __slots__ = ()
    NAME = "SERVER"


class RdataCommand(BaseCommand, _Rdata):
    """``RDATA <stream_name> <instance_name> <token> <row_json>``: one row of a stream.

    ``token`` is None on the wire word ``batch``: more rows share the same token and the
    client must not advance its position until the RDATA carrying the number arrives.
    ``row`` is the decoded JSON; its shape is defined by the stream.
    """

    __slots__ = ()
    NAME = "RDATA"


class PositionCommand(BaseCommand, _Position):
    """``POSITION <stream_name> <instance_name> <prev_token> <new_token>``.

    The writer wrote nothing between ``prev_token`` and ``new_token``; a receiver whose
    view of that writer is behind ``prev_token`` has missed rows and must fetch them.
    """

    __slots__ = ()
    NAME = "POSITION"


class ErrorCommand(BaseCommand, _Error):
    """``ERROR <message>``: the sender hit an error and will usually close."""

    __slots__ = ()
    NAME = "ERROR"


class PingCommand(BaseCommand, _Ping):
    """``PING <data>``: keep-alive; data is free text (Synapse sends a ms timestamp)."""

    __slots__ = ()
    NAME = "PING"


class NameCommand(BaseCommand, _Name):
    """``NAME <client_name>``: the client's human-friendly name."""

    __slots__ = ()
    NAME = "NAME"


class ReplicateCommand(BaseCommand, _Replicate):
    """``REPLICATE``: ask the server for the current position of every stream.

    Synapse writes it as ``"REPLICATE "`` (trailing space); both forms parse.
    """

    __slots__ = ()
    NAME = "REPLICATE"


class ReplicateStreamCommand(BaseCommand, _ReplicateStream):
    """``REPLICATE <stream_name> <token>``: the older protocol revision's subscription.

    Asks for every row of ``stream_name`` (``ALL``: every stream the server writes) after
    ``token``, then the live rows. ``token`` is None on the wire word ``NOW``: only rows
    from now on. A roomstream extension to the current protocol, where a bare
    ``REPLICATE`` (:class:`ReplicateCommand`) keeps its meaning.
    """

    __slots__ = ()
    NAME = "REPLICATE"


class UserSyncCommand(BaseCommand, _UserSync):
    """``USER_SYNC <instance_id> <user_id> <device_id> <start|end> <last_sync_ms>``.

    A missing device is the word ``None`` on the wire (as in Synapse), so a device whose
    ID is literally ``"None"`` comes back as None.
    """

    __slots__ = ()
    NAME = "USER_SYNC"


class ClearUserSyncCommand(BaseCommand, _ClearUserSync):
    """``CLEAR_USER_SYNC <instance_id>``: forget every syncing user of that instance."""

    __slots__ = ()
    NAME = "CLEAR_USER_SYNC"


class FederationAckCommand(BaseCommand, _FederationAck):
    """``FEDERATION_ACK <instance_name> <token>``: federation stream processed up to token."""

    __slots__ = ()
    NAME = "FEDERATION_ACK"


class RemoteServerUpCommand(BaseCommand, _RemoteServerUp):
    """``REMOTE_SERVER_UP <server_name>``: a remote homeserver may be reachable again."""

    __slots__ = ()
    NAME = "REMOTE_SERVER_UP"


class UserIpCommand(BaseCommand, _UserIp):
    """``USER_IP <user_id> <json>``, json being
    ``[access_token, ip, user_agent, device_id, last_seen]``.

    (Synapse's docstring lists another order; this is the order its code writes.)
    """

    __slots__ = ()
    NAME = "USER_IP"

    def __repr__(self) -> str:
        # Keep the access token out of logs.
        return (
            f"UserIpCommand(user_id={self.user_id!r}, access_token=<redacted>, ip={self.ip!r}, "
            f"user_agent={self.user_agent!r}, device_id={self.device_id!r}, "
            f"last_seen={self.last_seen!r})"
        )


class LockReleasedCommand(BaseCommand, _LockReleased):
    """``LOCK_RELEASED ["<instance_name>","<lock_name>","<lock_key>"]`` (a JSON array)."""

    __slots__ = ()
    NAME = "LOCK_RELEASED"


class NewActiveTaskCommand(BaseCommand, _TaskId):
    """``NEW_ACTIVE_TASK <task_id>``: a scheduled task is ready (Synapse sends it over Redis)."""

    __slots__ = ()
    NAME = "NEW_ACTIVE_TASK"


class CancelTaskCommand(BaseCommand, _TaskId):
    """``CANCEL_TASK <task_id>``: a scheduled task was cancelled (Redis only in Synapse)."""

    __slots__ = ()
    NAME = "CANCEL_TASK"


Command: TypeAlias = (
    ServerCommand
    | RdataCommand
    | PositionCommand
    | ErrorCommand
    | PingCommand
    | NameCommand
    | ReplicateCommand
    | ReplicateStreamCommand
    | UserSyncCommand
    | ClearUserSyncCommand
    | FederationAckCommand
    | RemoteServerUpCommand
    | UserIpCommand
    | LockReleasedCommand
    | NewActiveTaskCommand
    | CancelTaskCommand
)

_COMMAND_CLASSES: tuple[type[BaseCommand], ...] = (
    ServerCommand,
    RdataCommand,
    PositionCommand,
    ErrorCommand,
    PingCommand,
    NameCommand,
    ReplicateCommand,
    ReplicateStreamCommand,
    UserSyncCommand,
    ClearUserSyncCommand,
    FederationAckCommand,
    RemoteServerUpCommand,
    UserIpCommand,
    LockReleasedCommand,
    NewActiveTaskCommand,
    CancelTaskCommand,
)

#: Every command name this module knows.
ALL_COMMAND_NAMES: frozenset[str] = frozenset(c.NAME for c in _COMMAND_CLASSES)

#: Commands a TCP replication *server* may send (what a client accepts).
SERVER_COMMANDS: frozenset[str] = frozenset(
    {"SERVER", "RDATA", "POSITION", "ERROR", "PING", "REMOTE_SERVER_UP", "LOCK_RELEASED"}
)

#: Commands a TCP replication *client* may send (what a server accepts).
CLIENT_COMMANDS: frozenset[str] = frozenset(
    {
        "NAME",
        "REPLICATE",
        "PING",
        "USER_SYNC",
        "CLEAR_USER_SYNC",
        "FEDERATION_ACK",
        "USER_IP",
        "ERROR",
        "REMOTE_SERVER_UP",
        "LOCK_RELEASED",
    }
)

#: Command name -> the TCP sides allowed to send it. NEW_ACTIVE_TASK and CANCEL_TASK map
#: to the empty set: Synapse only sends them over Redis, where every process publishes.
SENDERS: Mapping[str, frozenset[Side]] = MappingProxyType(
    {
        name: frozenset(
            side
            for side, allowed in ((Side.SERVER, SERVER_COMMANDS), (Side.CLIENT, CLIENT_COMMANDS))
            if name in allowed
        )
        for name in sorted(ALL_COMMAND_NAMES)
    }
)


def may_send(sender: Side, name: str, *, permissive: bool = False) -> bool:
    """Whether ``sender`` may send command ``name``.

    ``permissive`` is for a pub/sub transport (Synapse's Redis mode), where every process
    both publishes and subscribes: then any known command is allowed from anyone.
    """
    if permissive:
        return name in ALL_COMMAND_NAMES
    return sender in SENDERS.get(name, frozenset())


# ---------------------------------------------------------------------------------------
# Parsing


# Decoder used when orjson refuses input the standard library accepts: lone surrogate
# escapes (``"\ud800"``, which Synapse's encoder can emit) and out-of-range floats. Like
# Synapse's decoder it rejects the non-standard NaN/Infinity constants.
def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


_stdlib_decode = json.JSONDecoder(parse_constant=_reject_constant).decode
_orjson_loads = orjson.loads
_new = tuple.__new__
# Integers beyond 64 bits must stay exact: see roomstream.exactjson.
_DIGITS_TO_ZERO = DIGITS_TO_ZERO


def _decode_json(text: str, what: str) -> JsonValue:
    """Decode one JSON document exactly as Synapse's decoder would (integers exact)."""
    if not has_long_digit_run(text):
        try:
            return _orjson_loads(text)
        except orjson.JSONDecodeError:
            pass
    try:
        return _stdlib_decode(text)
    except (ValueError, RecursionError) as e:
        raise ProtocolError(f"{what} is not valid JSON: {e}") from None


def _preview(value: str) -> str:
    if len(value) > 60:
        value = value[:57] + "..."
    return repr(value)


# Stream tokens are 64-bit database values: 20 characters cover every one of them, and
# refusing longer ones keeps int() away from its (ValueError-raising) huge-number limit.
_MAX_TOKEN_CHARS = 20


def _token(text: str, what: str) -> int:
    # int() alone would also accept "+1", " 1", "1_0" and non-ASCII digits.
    digits = text[1:] if text[:1] == "-" else text
    if digits.isdigit() and digits.isascii():
        if len(text) > _MAX_TOKEN_CHARS:
            raise ProtocolError(f"{what} is out of range ({len(text)} characters)")
        return int(text)
    raise ProtocolError(f"{what} must be an integer, got {_preview(text)}")


def _name_field(text: str, what: str) -> str:
    if not text:
        raise ProtocolError(f"{what} must not be empty")
    return text


def _fields(cmd: str, rest: str, names: tuple[str, ...]) -> list[str]:
    parts = rest.split(" ")
    if len(parts) != len(names):
        raise ProtocolError(
            f"{cmd} expects {len(names)} arguments ({' '.join(names)}), got {len(parts)}"
        )
    for part, name in zip(parts, names, strict=True):
        if not part:
            raise ProtocolError(f"{cmd}: {name} must not be empty")
    return parts


def _parse_rdata(rest: str) -> RdataCommand:
    parts = rest.split(" ", 3)
    if len(parts) != 4:
        raise ProtocolError(
            f"RDATA expects 4 arguments (stream_name instance_name token row_json), "
            f"got {len(parts)}"
        )
    stream_name, instance_name, token_text, row_json = parts
    if not stream_name or not instance_name:
        raise ProtocolError("RDATA: stream_name and instance_name must not be empty")
    token: int | None
    if token_text.isdigit() and token_text.isascii() and len(token_text) <= _MAX_TOKEN_CHARS:
        token = int(token_text)
    elif token_text == "batch":
        token = None
    else:
        token = _token(token_text, "RDATA token")
    row = _decode_json(row_json, "RDATA row")
    return _new(RdataCommand, (stream_name, instance_name, token, row))


def _parse_position(rest: str) -> PositionCommand:
    parts = rest.split(" ")
    if len(parts) != 4:
        raise ProtocolError(
            f"POSITION expects 4 arguments (stream_name instance_name prev_token new_token), "
            f"got {len(parts)}"
        )
    stream_name, instance_name, prev_text, new_text = parts
    if not stream_name or not instance_name:
        raise ProtocolError("POSITION: stream_name and instance_name must not be empty")
    if (
        prev_text.isdigit()
        and new_text.isdigit()
        and prev_text.isascii()
        and new_text.isascii()
        and len(prev_text) <= _MAX_TOKEN_CHARS
        and len(new_text) <= _MAX_TOKEN_CHARS
    ):
        prev, new = int(prev_text), int(new_text)
    else:
        prev = _token(prev_text, "POSITION prev_token")
        new = _token(new_text, "POSITION new_token")
    return _new(PositionCommand, (stream_name, instance_name, prev, new))


def _parse_server(rest: str) -> ServerCommand:
    return ServerCommand(_name_field(rest, "SERVER server_name"))


def _parse_error(rest: str) -> ErrorCommand:
    return ErrorCommand(rest)


def _parse_ping(rest: str) -> PingCommand:
    return PingCommand(rest)


def _parse_name(rest: str) -> NameCommand:
    return NameCommand(_name_field(rest, "NAME client_name"))


def _parse_replicate(rest: str) -> ReplicateCommand | ReplicateStreamCommand:
    # The current protocol takes no arguments; the older one "<stream_name> <token|NOW>".
    if not rest:
        return ReplicateCommand()
    parts = rest.split(" ")
    if len(parts) != 2 or not all(parts):
        raise ProtocolError(
            f"REPLICATE takes no arguments, or <stream_name> <token|NOW>; got {_preview(rest)}"
        )
    stream_name, token_text = parts
    token = None if token_text == "NOW" else _token(token_text, "REPLICATE token")
    return ReplicateStreamCommand(stream_name, token)


_USER_SYNC_FIELDS = ("instance_id", "user_id", "device_id", "state", "last_sync_ms")


def _parse_user_sync(rest: str) -> UserSyncCommand:
    instance_id, user_id, device_id, state, last_sync = _fields(
        "USER_SYNC", rest, _USER_SYNC_FIELDS
    )
    if state == "start":
        is_syncing = True
    elif state == "end":
        is_syncing = False
    else:
        raise ProtocolError(f"USER_SYNC state must be 'start' or 'end', got {_preview(state)}")
    return UserSyncCommand(
        instance_id,
        user_id,
        None if device_id == "None" else device_id,
        is_syncing,
        _token(last_sync, "USER_SYNC last_sync_ms"),
    )


def _parse_clear_user_sync(rest: str) -> ClearUserSyncCommand:
    return ClearUserSyncCommand(_name_field(rest, "CLEAR_USER_SYNC instance_id"))


def _parse_federation_ack(rest: str) -> FederationAckCommand:
    instance_name, token = _fields("FEDERATION_ACK", rest, ("instance_name", "token"))
    return FederationAckCommand(instance_name, _token(token, "FEDERATION_ACK token"))


def _parse_remote_server_up(rest: str) -> RemoteServerUpCommand:
    return RemoteServerUpCommand(_name_field(rest, "REMOTE_SERVER_UP server_name"))


def _parse_user_ip(rest: str) -> UserIpCommand:
    user_id, sep, payload = rest.partition(" ")
    if not sep or not user_id:
        raise ProtocolError("USER_IP expects <user_id> <json array>")
    value = _decode_json(payload, "USER_IP payload")
    if not isinstance(value, list) or len(value) != 5:
        raise ProtocolError(
            "USER_IP payload must be [access_token, ip, user_agent, device_id, last_seen]"
        )
    access_token, ip, user_agent, device_id, last_seen = value
    if not (isinstance(access_token, str) and isinstance(ip, str) and isinstance(user_agent, str)):
        raise ProtocolError("USER_IP access_token, ip and user_agent must be strings")
    if device_id is not None and not isinstance(device_id, str):
        raise ProtocolError("USER_IP device_id must be a string or null")
    if type(last_seen) is not int:
        raise ProtocolError("USER_IP last_seen must be an integer")
    return UserIpCommand(user_id, access_token, ip, user_agent, device_id, last_seen)


def _parse_lock_released(rest: str) -> LockReleasedCommand:
    value = _decode_json(rest, "LOCK_RELEASED payload")
    if (
        not isinstance(value, list)
        or len(value) != 3
        or not all(isinstance(item, str) for item in value)
    ):
        raise ProtocolError(
            "LOCK_RELEASED payload must be a JSON array of 3 strings "
            "[instance_name, lock_name, lock_key]"
        )
    return LockReleasedCommand(value[0], value[1], value[2])


def _parse_new_active_task(rest: str) -> NewActiveTaskCommand:
    return NewActiveTaskCommand(_name_field(rest, "NEW_ACTIVE_TASK task_id"))


def _parse_cancel_task(rest: str) -> CancelTaskCommand:
    return CancelTaskCommand(_name_field(rest, "CANCEL_TASK task_id"))


_PARSERS: dict[str, Callable[[str], Command]] = {  # by NAME; REPLICATE has two forms
    "RDATA": _parse_rdata,
    "POSITION": _parse_position,
    "SERVER": _parse_server,
    "ERROR": _parse_error,
    "PING": _parse_ping,
    "NAME": _parse_name,
    "REPLICATE": _parse_replicate,
    "USER_SYNC": _parse_user_sync,
    "CLEAR_USER_SYNC": _parse_clear_user_sync,
    "FEDERATION_ACK": _parse_federation_ack,
    "REMOTE_SERVER_UP": _parse_remote_server_up,
    "USER_IP": _parse_user_ip,
    "LOCK_RELEASED": _parse_lock_released,
    "NEW_ACTIVE_TASK": _parse_new_active_task,
    "CANCEL_TASK": _parse_cancel_task,
}
assert set(_PARSERS) == ALL_COMMAND_NAMES


def _parse_text(text: str) -> Command:
    """Parse one line already decoded, stripped of its terminator and length-checked."""
    # RDATA (and then POSITION) is nearly all of the traffic. One split serves both fast
    # paths: no partition, no dict lookup, no extra call. Anything unusual falls through
    # to the general path below, which also produces the precise error. (20 = the
    # _MAX_TOKEN_CHARS bound, written as a literal to save a global lookup.)
    parts = text.split(" ", 4)
    if len(parts) == 5:
        name, stream_name, instance_name, token_text, payload = parts
        if name == "RDATA" and stream_name and instance_name:
            token: int | None = None
            if token_text.isdigit() and token_text.isascii() and len(token_text) <= 20:
                token = int(token_text)
            elif token_text != "batch":
                token = _token(token_text, "RDATA token")
            # (has_long_digit_run inlined: this is the hottest line of the codec.)
            if payload.encode().translate(_DIGITS_TO_ZERO).find(b"0000000000000000000") < 0:
                try:
                    row = _orjson_loads(payload)
                except orjson.JSONDecodeError:
                    row = _decode_json(payload, "RDATA row")
            else:
                row = _decode_json(payload, "RDATA row")  # may hold a > 64-bit integer
            return _new(RdataCommand, (stream_name, instance_name, token, row))
        if (
            name == "POSITION"
            and stream_name
            and instance_name
            and token_text.isdigit()
            and payload.isdigit()
            and token_text.isascii()
            and payload.isascii()
            and len(token_text) <= 20
            and len(payload) <= 20
        ):
            return _new(
                PositionCommand, (stream_name, instance_name, int(token_text), int(payload))
            )
    name, _, rest = text.partition(" ")
    try:
        parser = _PARSERS.get(name)
        if parser is not None:
            return parser(rest)
    except (ValueError, TypeError, OverflowError, RecursionError) as e:
        # Parsers raise ProtocolError themselves; this only keeps the "nothing but
        # ProtocolError" promise should a conversion fail in a way they did not foresee.
        raise ProtocolError(f"{name}: malformed arguments ({type(e).__name__})") from e
    if not text.strip():
        raise ProtocolError("empty line")
    raise ProtocolError(f"unknown command {_preview(name)}")


def _parse_str_line(line: str, max_line_length: int) -> Command:
    if line.endswith("\n"):
        line = line[:-1]
    if line.endswith("\r"):
        line = line[:-1]
    try:
        size = len(line) if line.isascii() else len(line.encode("utf-8"))
    except UnicodeEncodeError:
        # Lone surrogates: such a str could never have come off the wire.
        raise ProtocolError("line is not valid UTF-8") from None
    if size > max_line_length:
        raise ProtocolError("line length exceeded")
    if "\n" in line:
        raise ProtocolError("line contains a newline")
    return _parse_text(line)


def parse_line(line: bytes | str, *, max_line_length: int = DEFAULT_MAX_LINE_LENGTH) -> Command:
    """Parse one line of the protocol into a fully decoded command.

    ``line`` may end with ``\\n``, ``\\r\\n`` or ``\\r`` (one terminator is removed) or have none;
    it must not contain another newline. ``max_line_length`` bounds its UTF-8 length
    without the terminator. Raises ``ProtocolError`` (and nothing else) for anything
    that is not a valid command, including blank lines (callers skip those first).
    """
    if type(line) is not bytes:
        if isinstance(line, str):
            return _parse_str_line(line, max_line_length)
        try:
            line = memoryview(line).tobytes()  # not bytes(): bytes(10**9) allocates
        except TypeError:
            raise ProtocolError(f"expected bytes or str, got {type(line).__name__}") from None
    # Indexing bytes gives an int: cheaper than two endswith() calls on the hot path.
    if line and line[-1] == 10:  # b"\n"
        line = line[:-2] if line[-2:-1] == b"\r" else line[:-1]
    elif line and line[-1] == 13:  # b"\r"
        line = line[:-1]
    if len(line) > max_line_length:
        raise ProtocolError("line length exceeded")
    if 10 in line:  # b"\n"; the int form skips the substring-search setup
        raise ProtocolError("line contains a newline")
    try:
        text = line.decode()  # UTF-8, strict; no argument is measurably faster
    except UnicodeDecodeError:
        raise ProtocolError("line is not valid UTF-8") from None
    return _parse_text(text)


# ---------------------------------------------------------------------------------------
# Serialization

# Byte-identical to Synapse's encoder (stdlib json with compact separators, ASCII-only
# output, NaN/Infinity refused). orjson is not used here on purpose: it writes non-ASCII
# and DEL raw, formats floats differently (1e-7 vs 1e-07) and silently turns NaN into
# null, so its bytes would differ from Synapse's for some rows.
_stdlib_encoder = json.JSONEncoder(
    ensure_ascii=True, allow_nan=False, separators=(",", ":"), check_circular=False
)


def _make_fast_encoder() -> Callable[[JsonValue], str]:
    """The same encoder minus JSONEncoder.encode's per-call set-up.

    ``JSONEncoder.encode`` builds a fresh C encoder (``_json.make_encoder``) on every
    call; building it once with the very arguments ``JSONEncoder`` would pass gives the
    same bytes for less work. Falls back to ``JSONEncoder.encode`` if the C module is
    missing or does not agree on a probe.
    """
    from json import encoder as json_encoder

    make = getattr(json_encoder, "c_make_encoder", None)
    escape = getattr(json_encoder, "c_encode_basestring_ascii", None)
    if make is None or escape is None:
        return _stdlib_encoder.encode

    def default(value: object) -> object:
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")

    iterencode = make(None, default, escape, None, ":", ",", False, False, False)
    join = "".join

    def encode(value: JsonValue) -> str:
        return join(iterencode(value, 0))

    probe = ["é\x7f\U0001f600", {"k": [1, 1.5e-07, None, True]}, -(2**70), "\ud800"]
    try:
        if encode(probe) != _stdlib_encoder.encode(probe):
            return _stdlib_encoder.encode
    except Exception:  # pragma: no cover - an interpreter we do not know
        return _stdlib_encoder.encode
    return encode


_encode_json = _make_fast_encoder()

# Stream and instance names come from a small set; remember the ones already checked
# so the hot RDATA path does one set lookup instead of four scans. Bounded all the same.
_checked_words: set[str] = set()
_MAX_CHECKED_WORDS = 4096


def _check_word(value: object, what: str) -> str:
    """A space-delimited field: non-empty str without space, CR or LF."""
    if type(value) is not str or not value or " " in value or "\n" in value or "\r" in value:
        raise ValueError(f"{what} must be a non-empty string without spaces or newlines")
    return value


def _check_text(value: object, what: str, *, allow_empty: bool) -> str:
    """A trailing free-text field: str without CR or LF."""
    if type(value) is not str or "\n" in value or "\r" in value or not (value or allow_empty):
        raise ValueError(f"{what} must be a string without newlines")
    return value


def _check_int(value: object, what: str) -> int:
    if type(value) is not int:
        if isinstance(value, int) and not isinstance(value, bool):
            return int(value)
        raise ValueError(f"{what} must be an int")
    return value


def _json(value: JsonValue, what: str) -> str:
    try:
        return _encode_json(value)
    except (TypeError, ValueError, RecursionError) as e:
        raise ValueError(f"{what} cannot be encoded as JSON: {e}") from None


def _known_word(value: object, what: str) -> str:
    """``_check_word`` for a name not yet in the cache; caches it when valid."""
    word = _check_word(value, what)
    if len(_checked_words) >= _MAX_CHECKED_WORDS:
        _checked_words.clear()
    _checked_words.add(word)
    return word


def _ser_rdata(cmd: RdataCommand) -> str:
    stream_name, instance_name, token, row = cmd
    if stream_name not in _checked_words:
        _known_word(stream_name, "stream_name")
    if instance_name not in _checked_words:
        _known_word(instance_name, "instance_name")
    if token is None:
        token_text = "batch"
    elif type(token) is int:
        token_text = str(token)
    else:
        token_text = str(_check_int(token, "token"))
    try:
        row_json = _encode_json(row)
    except (TypeError, ValueError, RecursionError) as e:
        raise ValueError(f"row cannot be encoded as JSON: {e}") from None
    return f"RDATA {stream_name} {instance_name} {token_text} {row_json}\n"


def _ser_position(cmd: PositionCommand) -> str:
    stream_name, instance_name, prev_token, new_token = cmd
    if stream_name not in _checked_words:
        _known_word(stream_name, "stream_name")
    if instance_name not in _checked_words:
        _known_word(instance_name, "instance_name")
    if type(prev_token) is not int:
        prev_token = _check_int(prev_token, "prev_token")
    if type(new_token) is not int:
        new_token = _check_int(new_token, "new_token")
    return f"POSITION {stream_name} {instance_name} {prev_token} {new_token}\n"


def _ser_user_sync(cmd: UserSyncCommand) -> str:
    device = "None" if cmd.device_id is None else _check_word(cmd.device_id, "device_id")
    return (
        f"USER_SYNC {_check_word(cmd.instance_id, 'instance_id')} "
        f"{_check_word(cmd.user_id, 'user_id')} {device} "
        f"{'start' if cmd.is_syncing else 'end'} {_check_int(cmd.last_sync_ms, 'last_sync_ms')}\n"
    )


def _ser_federation_ack(cmd: FederationAckCommand) -> str:
    return (
        f"FEDERATION_ACK {_check_word(cmd.instance_name, 'instance_name')} "
        f"{_check_int(cmd.token, 'token')}\n"
    )


def _ser_user_ip(cmd: UserIpCommand) -> str:
    if cmd.device_id is not None and type(cmd.device_id) is not str:
        raise ValueError("device_id must be a string or None")
    for value, what in ((cmd.access_token, "access_token"), (cmd.ip, "ip")):
        if type(value) is not str:
            raise ValueError(f"{what} must be a string")
    if type(cmd.user_agent) is not str:
        raise ValueError("user_agent must be a string")
    payload = [
        cmd.access_token,
        cmd.ip,
        cmd.user_agent,
        cmd.device_id,
        _check_int(cmd.last_seen, "last_seen"),
    ]
    return f"USER_IP {_check_word(cmd.user_id, 'user_id')} {_json(payload, 'payload')}\n"


def _ser_lock_released(cmd: LockReleasedCommand) -> str:
    fields = [cmd.instance_name, cmd.lock_name, cmd.lock_key]
    if not all(type(f) is str for f in fields):
        raise ValueError("LOCK_RELEASED fields must be strings")
    return f"LOCK_RELEASED {_json(fields, 'payload')}\n"


def _simple(name: str, what: str, *, allow_empty: bool) -> Callable[[Any], str]:
    prefix = name + " "

    def ser(cmd: Any) -> str:
        return prefix + _check_text(cmd[0], what, allow_empty=allow_empty) + "\n"

    return ser


_SERIALIZERS: dict[type[BaseCommand], Callable[[Any], str]] = {
    RdataCommand: _ser_rdata,
    PositionCommand: _ser_position,
    ServerCommand: _simple("SERVER", "server_name", allow_empty=False),
    ErrorCommand: _simple("ERROR", "message", allow_empty=True),
    PingCommand: _simple("PING", "data", allow_empty=True),
    NameCommand: _simple("NAME", "client_name", allow_empty=False),
    ReplicateCommand: lambda cmd: "REPLICATE \n",
    ReplicateStreamCommand: lambda cmd: (
        f"REPLICATE {_check_word(cmd.stream_name, 'stream_name')} "
        f"{'NOW' if cmd.token is None else _check_int(cmd.token, 'token')}\n"
    ),
    UserSyncCommand: _ser_user_sync,
    ClearUserSyncCommand: _simple("CLEAR_USER_SYNC", "instance_id", allow_empty=False),
    FederationAckCommand: _ser_federation_ack,
    RemoteServerUpCommand: _simple("REMOTE_SERVER_UP", "server_name", allow_empty=False),
    UserIpCommand: _ser_user_ip,
    LockReleasedCommand: _ser_lock_released,
    NewActiveTaskCommand: _simple("NEW_ACTIVE_TASK", "task_id", allow_empty=False),
    CancelTaskCommand: _simple("CANCEL_TASK", "task_id", allow_empty=False),
}
assert set(_SERIALIZERS) == set(_COMMAND_CLASSES)


def serialize(cmd: Command, *, max_line_length: int = DEFAULT_MAX_LINE_LENGTH) -> bytes:
    """Encode ``cmd`` as one wire line, *including* the trailing ``\\n``.

    The result is what Synapse writes for the same command. Raises ``ValueError`` for a
    command that could not round-trip (a space or newline inside a space-delimited
    field, a non-JSON row, a wrong field type) or whose line, without ``\\n``, would be
    longer than ``max_line_length`` bytes (the peer would drop the connection).
    """
    serializer = _SERIALIZERS.get(type(cmd))
    if serializer is None:
        raise ValueError(f"not a replication command: {cmd!r}")
    try:
        # Every serializer returns the line with its "\n" already in place.
        data = serializer(cmd).encode()
    except UnicodeEncodeError:
        # Only a lone surrogate in a non-JSON field gets here (JSON escapes them).
        raise ValueError(f"{cmd.NAME}: field is not valid Unicode text") from None
    except TypeError as e:
        # e.g. an unhashable value where a name belongs.
        raise ValueError(f"{cmd.NAME}: field of the wrong type: {e}") from None
    if len(data) > max_line_length + 1:
        raise LineTooLongError(
            f"{cmd.NAME} line is {len(data) - 1} bytes, over the {max_line_length}-byte limit"
        )
    return data
