"""Sans-IO connection tests: start-up, framing, errors, direction checks, keep-alive timing.

Time is a plain float handed to every call, so there are no sleeps.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roomstream.replication.commands import (
    ErrorCommand,
    NameCommand,
    PingCommand,
    PositionCommand,
    RdataCommand,
    ReplicateCommand,
    ServerCommand,
    Side,
    UserSyncCommand,
    parse_line,
)
from roomstream.replication.connection import ConnectionState, ReplicationConnection

T0 = 1000.0


def lines_of(data: bytes) -> list[bytes]:
    assert data.endswith(b"\n") or data == b""
    return data.split(b"\n")[:-1]


def started_server(**kwargs: float) -> ReplicationConnection:
    conn = ReplicationConnection.server("hs.example", **kwargs)  # type: ignore[arg-type]
    conn.start(T0)
    conn.data_to_send()
    return conn


def started_client(expected: str | None = "hs.example", **kw: float) -> ReplicationConnection:
    conn = ReplicationConnection.client("worker1", expected, **kw)  # type: ignore[arg-type]
    conn.start(T0)
    conn.data_to_send()
    return conn


# --- start-up ----------------------------------------------------------------------------


def test_server_start_sends_server_then_ping() -> None:
    conn = ReplicationConnection.server("hs.example")
    assert conn.state is ConnectionState.NEW
    assert conn.next_deadline() is None
    conn.start(T0)
    assert lines_of(conn.data_to_send()) == [b"SERVER hs.example", b"PING 1000000"]
    assert conn.data_to_send() == b""
    assert conn.state is ConnectionState.OPEN
    with pytest.raises(RuntimeError):
        conn.start(T0)


def test_client_start_sends_name_ping_replicate() -> None:
    conn = ReplicationConnection.client("worker1", "hs.example")
    conn.start(T0)
    assert lines_of(conn.data_to_send()) == [b"NAME worker1", b"PING 1000000", b"REPLICATE "]


def test_client_accepts_expected_server_and_records_it() -> None:
    conn = started_client()
    cmds = conn.receive_data(b"SERVER hs.example\nPING 1\n", T0 + 1)
    assert cmds == [ServerCommand("hs.example"), PingCommand("1")]
    assert conn.peer_name == "hs.example"
    assert not conn.must_close


def test_client_rejects_wrong_server() -> None:
    conn = started_client()
    cmds = conn.receive_data(b"PING 1\nSERVER evil.example\nPOSITION events master 1 1\n", T0)
    assert cmds == [PingCommand("1")]  # nothing from or after the bad SERVER
    assert conn.must_close
    assert conn.error == "wrong remote: expected 'hs.example', got 'evil.example'"
    assert lines_of(conn.data_to_send()) == [
        b"ERROR wrong remote: expected 'hs.example', got 'evil.example'"
    ]


def test_client_without_expectation_accepts_any_server() -> None:
    conn = started_client(expected=None)
    assert conn.receive_data(b"SERVER anything\n", T0) == [ServerCommand("anything")]
    assert not conn.must_close


def test_server_records_client_name() -> None:
    conn = started_server()
    assert conn.receive_data(b"NAME worker1\nREPLICATE\n", T0) == [
        NameCommand("worker1"),
        ReplicateCommand(),
    ]
    assert conn.peer_name == "worker1"


def test_server_refuses_expected_server_name() -> None:
    with pytest.raises(ValueError):
        ReplicationConnection(Side.SERVER, "hs", expected_server_name="hs")
    with pytest.raises(ValueError):
        ReplicationConnection(Side.SERVER, "hs", timeout=0)


# --- framing -----------------------------------------------------------------------------

STREAM = (
    b"SERVER hs.example\n"
    b"PING 1490197665618\n"
    b"\n"
    b"   \n"
    b"POSITION events master 1 1\r\n"
    b'RDATA caches master batch ["get_user_by_id",["@t\xc3\xa9st:hs"],1490197670513]\n'
    b'RDATA caches master 54 ["get_user_by_id",["@test4:hs"],1490197670513]\n'
    b"ERROR server stopping\n"
)
EXPECTED = [
    ServerCommand("hs.example"),
    PingCommand("1490197665618"),
    PositionCommand("events", "master", 1, 1),
    RdataCommand("caches", "master", None, ["get_user_by_id", ["@tést:hs"], 1490197670513]),
    RdataCommand("caches", "master", 54, ["get_user_by_id", ["@test4:hs"], 1490197670513]),
    ErrorCommand("server stopping"),
]


def test_whole_stream_at_once() -> None:
    conn = started_client()
    assert conn.receive_data(STREAM, T0) == EXPECTED
    assert not conn.must_close  # a received ERROR is reported, the caller decides


def test_byte_by_byte() -> None:
    conn = started_client()
    got = []
    for i in range(len(STREAM)):
        got += conn.receive_data(STREAM[i : i + 1], T0)
    assert got == EXPECTED


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=20))
def test_any_chunking_gives_same_commands(cuts: list[int]) -> None:
    points = sorted(set(cuts))
    chunks = [STREAM[a:b] for a, b in zip([0, *points], [*points, len(STREAM)], strict=True)]
    conn = started_client()
    got = []
    for chunk in chunks:
        got += conn.receive_data(chunk, T0)
    assert got == EXPECTED
    assert not conn.must_close


def test_partial_line_waits_for_newline() -> None:
    conn = started_server()
    assert conn.receive_data(b"PING 12", T0) == []
    assert conn.receive_data(b"34", T0) == []
    assert conn.receive_data(b"\nPI", T0) == [PingCommand("1234")]


# --- errors ------------------------------------------------------------------------------


def test_bad_line_stops_processing_and_queues_error() -> None:
    conn = started_server()
    cmds = conn.receive_data(b"PING 1\nPOSITION events master x 1\nPING 2\n", T0)
    assert cmds == [PingCommand("1")]
    assert conn.must_close and conn.state is ConnectionState.CLOSED
    assert conn.error is not None and "POSITION" in conn.error
    out = lines_of(conn.data_to_send())
    assert len(out) == 1 and out[0].startswith(b"ERROR failed to parse line: ")
    assert isinstance(parse_line(out[0]), ErrorCommand)
    # Closed: later input is ignored, nothing else is produced, timers stop.
    assert conn.receive_data(b"PING 3\n", T0) == []
    conn.tick(T0 + 100)
    assert conn.data_to_send() == b""
    assert conn.next_deadline() is None
    assert conn.send(PingCommand("x"), T0) is False


def test_unknown_command_is_an_error() -> None:
    conn = started_server()
    assert conn.receive_data(b"HELLO\n", T0) == []
    assert conn.error == "failed to parse line: unknown command 'HELLO'"


@pytest.mark.parametrize(
    "line",
    [b"RDATA events master 1 []", b"POSITION events master 1 1", b"SERVER hs"],
)
def test_server_refuses_server_only_commands_from_client(line: bytes) -> None:
    conn = started_server()
    assert conn.receive_data(line + b"\n", T0) == []
    name = line.split(b" ")[0].decode()
    assert conn.error == f"invalid command: a client may not send {name}"
    assert lines_of(conn.data_to_send()) == [
        f"ERROR invalid command: a client may not send {name}".encode()
    ]


@pytest.mark.parametrize(
    "line",
    [b"NAME w", b"REPLICATE", b"USER_SYNC w @u:hs None start 1", b"FEDERATION_ACK w 1"],
)
def test_client_refuses_client_only_commands_from_server(line: bytes) -> None:
    conn = started_client()
    assert conn.receive_data(line + b"\n", T0) == []
    assert conn.error is not None and "a server may not send" in conn.error


def test_permissive_mode_accepts_everything_known() -> None:
    conn = ReplicationConnection.server("hs", permissive=True)
    conn.start(T0)
    cmds = conn.receive_data(b"RDATA events master 1 []\nUSER_SYNC w @u:hs None end 1\n", T0)
    assert [c.NAME for c in cmds] == ["RDATA", "USER_SYNC"]
    assert conn.send(UserSyncCommand("w", "@u:hs", None, True, 1), T0)


def test_line_length_exceeded_complete_and_partial() -> None:
    conn = started_server(max_line_length=20)
    conn.receive_data(b"PING " + b"x" * 15 + b"\n", T0)  # exactly 20: fine
    assert not conn.must_close
    conn.receive_data(b"PING " + b"x" * 16 + b"\n", T0)
    assert conn.error == "line length exceeded"

    conn = started_server(max_line_length=20)
    conn.receive_data(b"PING " + b"x" * 10, T0)
    assert not conn.must_close
    conn.receive_data(b"x" * 6, T0)  # 21 bytes and no newline yet
    assert conn.error == "line length exceeded"

    conn = started_server(max_line_length=20)
    conn.receive_data(b"PING 1\nPING " + b"x" * 16, T0)  # partial tail after a newline
    assert conn.error == "line length exceeded"


def test_bad_utf8_is_a_protocol_error() -> None:
    conn = started_server()
    conn.receive_data(b"PING \xff\n", T0)
    assert conn.error == "failed to parse line: line is not valid UTF-8"


def test_errors_are_per_connection() -> None:
    a, b = started_server(), started_server()
    a.receive_data(b"garbage\n", T0)
    assert a.must_close
    assert b.receive_data(b"PING 1\n", T0) == [PingCommand("1")]
    assert not b.must_close


# --- sending and closing -----------------------------------------------------------------


def test_send_checks_direction_and_serializes() -> None:
    server = started_server()
    assert server.send(PositionCommand("events", "master", 5, 6), T0)
    assert server.data_to_send() == b"POSITION events master 5 6\n"
    with pytest.raises(ValueError, match="a server may not send USER_SYNC"):
        server.send(UserSyncCommand("w", "@u:hs", None, True, 1), T0)
    client = started_client()
    with pytest.raises(ValueError, match="a client may not send RDATA"):
        client.send(RdataCommand("events", "master", 1, []), T0)


def test_local_close_with_reason() -> None:
    conn = started_server()
    conn.close(T0, "server stopping")
    assert conn.must_close
    assert conn.error is None  # not a protocol error
    assert conn.data_to_send() == b"ERROR server stopping\n"
    conn.close(T0, "again")
    assert conn.data_to_send() == b""


def test_connection_lost_drops_output() -> None:
    conn = started_server()
    conn.send(PingCommand("x"), T0)
    conn.connection_lost()
    assert conn.data_to_send() == b""
    assert conn.receive_data(b"PING 1\n", T0) == []


# --- keep-alive and time-out -------------------------------------------------------------


def test_pings_when_idle_every_interval() -> None:
    conn = started_server()
    assert conn.next_deadline() == T0 + 5
    conn.tick(T0 + 4.999)
    assert conn.data_to_send() == b""
    conn.tick(T0 + 5)
    assert conn.data_to_send() == b"PING 1005000\n"
    assert conn.next_deadline() == T0 + 10


def test_sending_anything_postpones_ping() -> None:
    conn = started_server()
    conn.send(PositionCommand("events", "master", 1, 1), T0 + 3)
    conn.data_to_send()
    assert conn.next_deadline() == T0 + 8
    conn.tick(T0 + 7)
    assert conn.data_to_send() == b""
    conn.tick(T0 + 8)
    assert conn.data_to_send().startswith(b"PING ")


def test_no_timeout_before_peer_pings() -> None:
    # Someone on netcat who never sends PING is never timed out.
    conn = started_server()
    conn.receive_data(b"NAME human\n", T0)
    for minute in range(1, 60):
        now = T0 + 60 * minute
        assert conn.next_deadline() is not None
        assert conn.next_deadline() <= now  # type: ignore[operator]
        conn.tick(now)
        assert not conn.must_close
        assert lines_of(conn.data_to_send()) == [f"PING {int(now * 1000)}".encode()]


def test_timeout_after_peer_pinged() -> None:
    conn = started_server()
    conn.receive_data(b"PING 1\n", T0 + 1)
    assert conn.received_ping
    conn.tick(T0 + 5)  # our own ping
    conn.data_to_send()
    assert conn.next_deadline() == T0 + 10  # next ping before the T0+16 time-out
    conn.tick(T0 + 10)
    conn.tick(T0 + 15)
    conn.data_to_send()
    assert conn.next_deadline() == T0 + 16
    conn.tick(T0 + 15.999)
    assert not conn.must_close
    conn.tick(T0 + 16)
    assert conn.must_close
    assert conn.error == "ping timeout"
    assert conn.data_to_send() == b"ERROR ping timeout\n"
    assert conn.next_deadline() is None


def test_any_received_command_resets_timeout() -> None:
    conn = started_client(timeout=15)
    conn.receive_data(b"PING 1\n", T0)
    conn.receive_data(b'RDATA events master 2 ["x"]\n', T0 + 14)
    conn.tick(T0 + 15)
    assert not conn.must_close
    conn.tick(T0 + 29)
    assert conn.must_close


def test_blank_lines_and_partial_lines_do_not_reset_timeout() -> None:
    conn = started_server()
    conn.receive_data(b"PING 1\n", T0)
    conn.receive_data(b"\n\n   \nPING 2", T0 + 10)  # blanks + an unfinished line
    conn.tick(T0 + 15)
    assert conn.error == "ping timeout"


def test_configurable_timeout_and_interval() -> None:
    conn = started_server(ping_interval=1.0, timeout=3.0)
    conn.receive_data(b"PING 1\n", T0)
    assert conn.next_deadline() == T0 + 1
    conn.tick(T0 + 1)
    conn.tick(T0 + 2)
    assert lines_of(conn.data_to_send()) == [b"PING 1001000", b"PING 1002000"]
    conn.tick(T0 + 3)
    assert conn.error == "ping timeout"


def test_two_ends_talk_to_each_other() -> None:
    server = ReplicationConnection.server("hs.example")
    client = ReplicationConnection.client("worker1", "hs.example")
    server.start(T0)
    client.start(T0)
    from_server = server.receive_data(client.data_to_send(), T0)
    from_client = client.receive_data(server.data_to_send(), T0)
    assert [c.NAME for c in from_server] == ["NAME", "PING", "REPLICATE"]
    assert [c.NAME for c in from_client] == ["SERVER", "PING"]
    server.send(PositionCommand("events", "master", 53, 53), T0)
    assert client.receive_data(server.data_to_send(), T0) == [
        PositionCommand("events", "master", 53, 53)
    ]
    assert server.received_ping and client.received_ping
    assert not server.must_close and not client.must_close
