"""Codec tests: exact wire lines, round trips, the direction table and every rejection."""

from __future__ import annotations

import json
from typing import Any

import pytest

from roomstream.replication.commands import (
    ALL_COMMAND_NAMES,
    CLIENT_COMMANDS,
    DEFAULT_MAX_LINE_LENGTH,
    SENDERS,
    SERVER_COMMANDS,
    CancelTaskCommand,
    ClearUserSyncCommand,
    Command,
    ErrorCommand,
    FederationAckCommand,
    LockReleasedCommand,
    NameCommand,
    NewActiveTaskCommand,
    PingCommand,
    PositionCommand,
    ProtocolError,
    RdataCommand,
    RemoteServerUpCommand,
    ReplicateCommand,
    ReplicateStreamCommand,
    ServerCommand,
    Side,
    UserIpCommand,
    UserSyncCommand,
    may_send,
    parse_line,
    serialize,
)

EVENTS_LINE = (
    b'RDATA events master 14 ["ev",["$a:hs","!r:hs","m.room.message",null,null,null,null,'
    b"false,false]]"
)

# (command, exact line Synapse writes for it, without the newline)
KNOWN: list[tuple[Command, bytes]] = [
    (
        RdataCommand(
            "events",
            "master",
            14,
            ["ev", ["$a:hs", "!r:hs", "m.room.message", None, None, None, None, False, False]],
        ),
        EVENTS_LINE,
    ),
    (PositionCommand("events", "master", 53, 53), b"POSITION events master 53 53"),
    (
        RdataCommand("caches", "master", None, ["get_user_by_id", ["@test:localhost:8823"], 1]),
        b'RDATA caches master batch ["get_user_by_id",["@test:localhost:8823"],1]',
    ),
    (ServerCommand("localhost:8823"), b"SERVER localhost:8823"),
    (PingCommand("1490197665618"), b"PING 1490197665618"),
    (NameCommand("synapse.app.appservice"), b"NAME synapse.app.appservice"),
    (ReplicateCommand(), b"REPLICATE "),
    (ErrorCommand("server stopping"), b"ERROR server stopping"),
    (
        UserSyncCommand("worker1", "@a:hs", "DEV", True, 1700000000000),
        b"USER_SYNC worker1 @a:hs DEV start 1700000000000",
    ),
    (
        UserSyncCommand("worker1", "@a:hs", None, False, 5),
        b"USER_SYNC worker1 @a:hs None end 5",
    ),
    (ClearUserSyncCommand("worker1"), b"CLEAR_USER_SYNC worker1"),
    (FederationAckCommand("federation_sender1", 42), b"FEDERATION_ACK federation_sender1 42"),
    (RemoteServerUpCommand("other.example"), b"REMOTE_SERVER_UP other.example"),
    (
        UserIpCommand("@a:hs", "syt_token", "10.0.0.1", "Element/1.0 (x; y)", "DEV", 1234),
        b'USER_IP @a:hs ["syt_token","10.0.0.1","Element/1.0 (x; y)","DEV",1234]',
    ),
    (
        UserIpCommand("@a:hs", "t", "::1", "", None, 0),
        b'USER_IP @a:hs ["t","::1","",null,0]',
    ),
    (
        LockReleasedCommand("worker1", "purge", "!room:hs"),
        b'LOCK_RELEASED ["worker1","purge","!room:hs"]',
    ),
    (NewActiveTaskCommand("abcDEF"), b"NEW_ACTIVE_TASK abcDEF"),
    (CancelTaskCommand("abcDEF"), b"CANCEL_TASK abcDEF"),
]


@pytest.mark.parametrize(("cmd", "line"), KNOWN, ids=[c.NAME for c, _ in KNOWN])
def test_known_lines_serialize_exactly(cmd: Command, line: bytes) -> None:
    assert serialize(cmd) == line + b"\n"


@pytest.mark.parametrize(("cmd", "line"), KNOWN, ids=[c.NAME for c, _ in KNOWN])
def test_known_lines_parse_to_the_command(cmd: Command, line: bytes) -> None:
    for variant in (line, line + b"\n", line + b"\r\n", line.decode()):
        parsed = parse_line(variant)
        assert parsed == cmd
        assert type(parsed) is type(cmd)


def test_every_command_class_is_covered() -> None:
    assert {c.NAME for c, _ in KNOWN} == ALL_COMMAND_NAMES


def test_rdata_fields_are_decoded() -> None:
    cmd = parse_line(EVENTS_LINE)
    assert isinstance(cmd, RdataCommand)
    assert (cmd.stream_name, cmd.instance_name, cmd.token) == ("events", "master", 14)
    assert cmd.row[0] == "ev"
    assert cmd.row[1][0] == "$a:hs"
    assert cmd.row[1][3] is None


def test_batch_token_is_none_and_number_ends_batch() -> None:
    lines = [
        b'RDATA caches master batch ["get_user_by_id",["@test:localhost:8823"],1490197670513]',
        b'RDATA caches master 54 ["get_user_by_id",["@test4:localhost:8823"],1490197670513]',
    ]
    first, last = (parse_line(line) for line in lines)
    assert isinstance(first, RdataCommand) and isinstance(last, RdataCommand)
    assert first.token is None
    assert last.token == 54


def test_json_with_spaces_is_accepted_and_reencoded_compactly() -> None:
    cmd = parse_line(b'RDATA caches master 550953771 ["get_user_by_id", ["@bob:e.com"], 15]')
    assert serialize(cmd) == b'RDATA caches master 550953771 ["get_user_by_id",["@bob:e.com"],15]\n'


def test_non_ascii_row_is_escaped_like_synapse() -> None:
    row = ["ev", ["$é:hs", "!r:hs", "m.room.message", "ü\U0001f600\x7f", None]]
    line = serialize(RdataCommand("events", "master", 3, row))
    # Synapse: json.JSONEncoder(separators=(",", ":")) with the default ensure_ascii.
    expected_json = json.dumps(row, separators=(",", ":"), ensure_ascii=True)
    assert line == f"RDATA events master 3 {expected_json}\n".encode()
    assert line.isascii()
    assert b"\\ud83d\\ude00" in line and b"\\u007f" in line
    assert parse_line(line) == RdataCommand("events", "master", 3, row)


def test_raw_utf8_row_from_another_encoder_parses() -> None:
    raw = 'RDATA events master 3 ["ü\U0001f600"]'.encode()
    cmd = parse_line(raw)
    assert isinstance(cmd, RdataCommand)
    assert cmd.row == ["ü\U0001f600"]


def test_lone_surrogate_escape_falls_back_to_stdlib_decoder() -> None:
    # Synapse's encoder emits this for a str holding a lone surrogate; orjson refuses it.
    cmd = parse_line(b'RDATA caches master 1 ["\\ud800"]')
    assert isinstance(cmd, RdataCommand)
    assert cmd.row == ["\ud800"]
    assert serialize(cmd) == b'RDATA caches master 1 ["\\ud800"]\n'


def test_floats_serialize_like_stdlib() -> None:
    row = [1e16, 1e-7, 0.1, -0.0]
    line = serialize(RdataCommand("s", "i", 1, row))
    assert line == b"RDATA s i 1 [1e+16,1e-07,0.1,-0.0]\n"
    parsed = parse_line(line)
    assert isinstance(parsed, RdataCommand)
    assert parsed.row == row


def test_integers_beyond_64_bits_decode_exactly() -> None:
    # orjson would give 1.8446744073709552e+19; Synapse's decoder keeps the int.
    row = [2**64, -(2**63) - 1, 10**30, {"k": [2**100]}, 1.5, "12345678901234567890"]
    for line in (
        serialize(RdataCommand("caches", "master", 7, row)),
        b"RDATA caches master 7 " + json.dumps(row, separators=(",", ":")).encode(),
    ):
        parsed = parse_line(line)
        assert isinstance(parsed, RdataCommand)
        assert parsed.row == row
        assert type(parsed.row[0]) is int and type(parsed.row[3]["k"][0]) is int
    ip = parse_line(b'USER_IP @u:hs ["tok","1.2.3.4","ua",null,18446744073709551616]')
    assert isinstance(ip, UserIpCommand) and ip.last_seen == 2**64


def test_legacy_replicate_parses_with_a_stream_and_token() -> None:
    assert parse_line(b"REPLICATE events 53") == ReplicateStreamCommand("events", 53)
    assert parse_line(b"REPLICATE ALL NOW\r\n") == ReplicateStreamCommand("ALL", None)
    assert serialize(ReplicateStreamCommand("caches", 0)) == b"REPLICATE caches 0\n"
    assert serialize(ReplicateStreamCommand("ALL", None)) == b"REPLICATE ALL NOW\n"
    assert parse_line(b"REPLICATE ") == ReplicateCommand()  # the current form is unchanged


def test_negative_tokens_parse() -> None:
    assert parse_line(b"POSITION backfill master -5 -3") == PositionCommand(
        "backfill", "master", -5, -3
    )
    assert parse_line(b"RDATA backfill master -7 []") == RdataCommand("backfill", "master", -7, [])


def test_simple_commands_keep_spaces_and_empty_data() -> None:
    assert parse_line(b"ERROR failed to parse: x y") == ErrorCommand("failed to parse: x y")
    assert parse_line(b"PING") == PingCommand("")
    assert parse_line(b"PING ") == PingCommand("")
    assert serialize(PingCommand("")) == b"PING \n"
    assert parse_line(b"REPLICATE") == ReplicateCommand()


def test_user_sync_device_none_quirk_matches_synapse() -> None:
    cmd = parse_line(serialize(UserSyncCommand("w", "@u:hs", "None", True, 1)))
    assert isinstance(cmd, UserSyncCommand)
    assert cmd.device_id is None


def test_user_ip_repr_hides_access_token() -> None:
    cmd = UserIpCommand("@a:hs", "secret_token", "1.2.3.4", "ua", None, 1)
    assert "secret_token" not in repr(cmd)
    assert "1.2.3.4" in repr(cmd)


def test_commands_are_immutable_and_typed_equality() -> None:
    cmd = PositionCommand("events", "master", 1, 2)
    with pytest.raises(AttributeError):
        cmd.new_token = 3  # type: ignore[misc]
    with pytest.raises(AttributeError):
        cmd.extra = 1  # type: ignore[attr-defined]
    assert PingCommand("x") != ErrorCommand("x")
    assert PingCommand("x") != ("x",)
    assert PingCommand("x") == PingCommand("x")
    assert len({PingCommand("x"), ErrorCommand("x"), PingCommand("x")}) == 2
    assert cmd._replace(new_token=3) == PositionCommand("events", "master", 1, 3)
    assert type(cmd._replace(new_token=3)) is PositionCommand


# --- direction table ---------------------------------------------------------------------


def test_direction_table_matches_protocol() -> None:
    assert {
        "SERVER",
        "RDATA",
        "POSITION",
        "ERROR",
        "PING",
        "REMOTE_SERVER_UP",
        "LOCK_RELEASED",
    } == SERVER_COMMANDS
    assert {
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
    } == CLIENT_COMMANDS
    assert SENDERS["RDATA"] == {Side.SERVER}
    assert SENDERS["USER_IP"] == {Side.CLIENT}
    assert SENDERS["PING"] == {Side.SERVER, Side.CLIENT}
    assert SENDERS["NEW_ACTIVE_TASK"] == frozenset()
    assert set(SENDERS) == ALL_COMMAND_NAMES
    with pytest.raises(TypeError):
        SENDERS["RDATA"] = frozenset()  # type: ignore[index]


@pytest.mark.parametrize(
    ("sender", "name", "strict", "permissive"),
    [
        (Side.SERVER, "RDATA", True, True),
        (Side.CLIENT, "RDATA", False, True),
        (Side.CLIENT, "POSITION", False, True),
        (Side.CLIENT, "SERVER", False, True),
        (Side.SERVER, "NAME", False, True),
        (Side.SERVER, "REPLICATE", False, True),
        (Side.SERVER, "USER_SYNC", False, True),
        (Side.SERVER, "USER_IP", False, True),
        (Side.SERVER, "FEDERATION_ACK", False, True),
        (Side.SERVER, "CLEAR_USER_SYNC", False, True),
        (Side.CLIENT, "USER_IP", True, True),
        (Side.CLIENT, "ERROR", True, True),
        (Side.SERVER, "REMOTE_SERVER_UP", True, True),
        (Side.CLIENT, "NEW_ACTIVE_TASK", False, True),
        (Side.SERVER, "BOGUS", False, False),
    ],
)
def test_may_send(sender: Side, name: str, strict: bool, permissive: bool) -> None:
    assert may_send(sender, name) is strict
    assert may_send(sender, name, permissive=True) is permissive


# --- rejections --------------------------------------------------------------------------

BAD: list[tuple[bytes, str]] = [
    (b"", "empty line"),
    (b"   ", "empty line"),
    (b"HELLO world", "unknown command 'HELLO'"),
    (b"rdata events master 1 []", "unknown command 'rdata'"),
    (b"RDATA events master 1", "RDATA expects 4 arguments"),
    (b"RDATA events master x1 []", "RDATA token must be an integer, got 'x1'"),
    (b"RDATA events master +1 []", "must be an integer"),
    (b"RDATA events master 1_0 []", "must be an integer"),
    (b"RDATA events master \xd9\xa1 []", "must be an integer"),
    (b"RDATA events master 1 [1,", "RDATA row is not valid JSON"),
    (b"RDATA events master 1 [NaN]", "RDATA row is not valid JSON"),
    (b"RDATA events master 1 [Infinity]", "RDATA row is not valid JSON"),
    (b"RDATA events master 1 ", "RDATA row is not valid JSON"),
    (b"RDATA events master 1 " + b"[" * 5000 + b"]" * 5000, "RDATA row is not valid JSON"),
    (b"RDATA  master 1 []", "must not be empty"),
    (b"POSITION events master 1", "POSITION expects 4 arguments"),
    (b"POSITION events master 1 2 3", "POSITION expects 4 arguments"),
    (b"POSITION events master 1 two", "POSITION new_token must be an integer"),
    (b"POSITION events master 1.0 2", "POSITION prev_token must be an integer"),
    (b"POSITION events master - 2", "POSITION prev_token must be an integer"),
    (b"POSITION events master " + b"9" * 5000 + b" 1", "prev_token is out of range"),
    (b"RDATA events master 123456789012345678901 []", "RDATA token is out of range"),
    (b"SERVER", "SERVER server_name must not be empty"),
    (b"NAME ", "NAME client_name must not be empty"),
    (b"REPLICATE events", "REPLICATE takes no arguments, or <stream_name> <token|NOW>"),
    (b"REPLICATE events 5 6", "REPLICATE takes no arguments, or <stream_name> <token|NOW>"),
    (b"REPLICATE events later", "REPLICATE token must be an integer"),
    (b"USER_SYNC w @u:hs DEV maybe 1", "USER_SYNC state must be 'start' or 'end'"),
    (b"USER_SYNC w @u:hs DEV start", "USER_SYNC expects 5 arguments"),
    (b"USER_SYNC w @u:hs DEV start x", "USER_SYNC last_sync_ms must be an integer"),
    (b"USER_SYNC w  DEV start 1 ", "USER_SYNC expects 5 arguments"),
    (b"USER_SYNC w  DEV start 1", "USER_SYNC: user_id must not be empty"),
    (b"CLEAR_USER_SYNC", "CLEAR_USER_SYNC instance_id must not be empty"),
    (b"FEDERATION_ACK w", "FEDERATION_ACK expects 2 arguments"),
    (b"FEDERATION_ACK w 1 2", "FEDERATION_ACK expects 2 arguments"),
    (b"FEDERATION_ACK w abc", "FEDERATION_ACK token must be an integer"),
    (b"REMOTE_SERVER_UP ", "REMOTE_SERVER_UP server_name must not be empty"),
    (b"USER_IP @a:hs", "USER_IP expects <user_id> <json array>"),
    (b"USER_IP @a:hs {", "USER_IP payload is not valid JSON"),
    (b'USER_IP @a:hs ["t","ip","ua",null]', "USER_IP payload must be"),
    (b'USER_IP @a:hs {"a":1}', "USER_IP payload must be"),
    (b'USER_IP @a:hs ["t","ip","ua",null,"1"]', "USER_IP last_seen must be an integer"),
    (b'USER_IP @a:hs ["t","ip","ua",null,true]', "USER_IP last_seen must be an integer"),
    (b'USER_IP @a:hs ["t",1,"ua",null,1]', "USER_IP access_token, ip and user_agent"),
    (b'USER_IP @a:hs ["t","ip","ua",5,1]', "USER_IP device_id must be a string or null"),
    (b'LOCK_RELEASED ["a","b"]', "LOCK_RELEASED payload must be a JSON array of 3 strings"),
    (b'LOCK_RELEASED ["a","b",3]', "LOCK_RELEASED payload must be a JSON array of 3 strings"),
    (b"LOCK_RELEASED a b c", "LOCK_RELEASED payload is not valid JSON"),
    (b"NEW_ACTIVE_TASK", "NEW_ACTIVE_TASK task_id must not be empty"),
    (b"CANCEL_TASK", "CANCEL_TASK task_id must not be empty"),
    (b"PING \xff\xfe", "line is not valid UTF-8"),
    (b"PING a\nPING b", "line contains a newline"),
    (b"PING " + b"x" * DEFAULT_MAX_LINE_LENGTH, "line length exceeded"),
]


@pytest.mark.parametrize(("line", "reason"), BAD, ids=[r for _, r in BAD])
def test_bad_lines_raise_protocol_error_with_reason(line: bytes, reason: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_line(line)
    assert reason in info.value.reason
    assert "\n" not in info.value.reason and "\r" not in info.value.reason
    assert len(info.value.reason) <= 400
    # The reason must itself fit in a line we can send.
    assert serialize(ErrorCommand(info.value.reason)).count(b"\n") == 1


def test_bad_str_inputs() -> None:
    with pytest.raises(ProtocolError, match="not valid UTF-8"):
        parse_line("PING \ud800")
    with pytest.raises(ProtocolError, match="line length exceeded"):
        parse_line("PING " + "é" * (DEFAULT_MAX_LINE_LENGTH // 2))
    with pytest.raises(ProtocolError, match="newline"):
        parse_line("PING a\nb")
    with pytest.raises(ProtocolError, match="expected bytes or str"):
        parse_line(12345)  # type: ignore[arg-type]


def test_line_length_limit_is_exclusive_of_terminator_and_configurable() -> None:
    line = b"PING " + b"x" * (DEFAULT_MAX_LINE_LENGTH - 5)
    assert len(line) == DEFAULT_MAX_LINE_LENGTH
    assert parse_line(line + b"\r\n") == PingCommand("x" * (DEFAULT_MAX_LINE_LENGTH - 5))
    with pytest.raises(ProtocolError, match="line length exceeded"):
        parse_line(line + b"x")
    with pytest.raises(ProtocolError, match="line length exceeded"):
        parse_line(b"PING 12345", max_line_length=9)
    assert parse_line(b"PING 12345", max_line_length=10) == PingCommand("12345")


def test_protocol_error_reason_is_one_bounded_line() -> None:
    err = ProtocolError("a\nb\r" + "x" * 1000)
    assert "\n" not in err.reason and "\r" not in err.reason
    assert len(err.reason) == 400
    assert err.reason.endswith("...")
    assert str(err) == err.reason


# --- serializer refusals -----------------------------------------------------------------

UNSENDABLE: list[tuple[Any, str]] = [
    (RdataCommand("ev ents", "master", 1, []), "stream_name"),
    (RdataCommand("", "master", 1, []), "stream_name"),
    (RdataCommand("events", "mas\nter", 1, []), "instance_name"),
    (RdataCommand("events", "master", "1", []), "token"),  # type: ignore[arg-type]
    (RdataCommand("events", "master", True, []), "token"),
    (RdataCommand("events", "master", 1, [float("nan")]), "row cannot be encoded"),
    (RdataCommand("events", "master", 1, [{1, 2}]), "row cannot be encoded"),
    (PositionCommand("events", "master", 1, None), "new_token"),  # type: ignore[arg-type]
    (PingCommand("a\nb"), "data"),
    (ErrorCommand("a\rb"), "message"),
    (ServerCommand(""), "server_name"),
    (NameCommand(""), "client_name"),
    (UserSyncCommand("w", "@u hs", None, True, 1), "user_id"),
    (UserSyncCommand("w", "@u:hs", "D D", True, 1), "device_id"),
    (UserIpCommand("@u:hs", None, "ip", "ua", None, 1), "access_token"),  # type: ignore[arg-type]
    (UserIpCommand("@u:hs", "t", "ip", "ua", 5, 1), "device_id"),  # type: ignore[arg-type]
    (LockReleasedCommand("a", "b", 3), "strings"),  # type: ignore[arg-type]
    (PingCommand("\ud800"), "not valid Unicode"),
    (RdataCommand("s", "i", 1, "x" * DEFAULT_MAX_LINE_LENGTH), "over the 16384-byte limit"),
    (("not", "a", "command"), "not a replication command"),
]


@pytest.mark.parametrize(("cmd", "message"), UNSENDABLE)
def test_serialize_refuses_what_cannot_round_trip(cmd: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        serialize(cmd)


def test_serialize_ends_with_single_newline_and_int_subclasses_are_plain() -> None:
    from enum import IntEnum

    class Tok(IntEnum):
        X = 7

    assert serialize(PositionCommand("s", "i", Tok.X, 8)) == b"POSITION s i 7 8\n"
