"""Property tests: generated commands round-trip; garbage never raises anything else."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roomstream.replication.commands import (
    ALL_COMMAND_NAMES,
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
    UserIpCommand,
    UserSyncCommand,
    parse_line,
    serialize,
)
from roomstream.replication.connection import ReplicationConnection

# Text that can travel in a field: valid Unicode (no lone surrogates), no CR/LF.
text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"))
word = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters=" \r\n"), min_size=1
)
token = st.integers(min_value=-(2**63), max_value=2**63 - 1)
json_scalar = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.integers(min_value=-(2**200), max_value=2**200)  # beyond 64 bits: kept exact
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(blacklist_categories=("Cs",)))
)
json_value = st.recursive(
    json_scalar,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(st.characters(blacklist_categories=("Cs",))), inner, max_size=4)
    ),
    max_leaves=12,
)

commands: st.SearchStrategy[Command] = st.one_of(
    st.builds(ServerCommand, word),
    st.builds(RdataCommand, word, word, st.none() | token, json_value),
    st.builds(PositionCommand, word, word, token, token),
    st.builds(ErrorCommand, text),
    st.builds(PingCommand, text),
    st.builds(NameCommand, word.filter(lambda s: s.strip() != "") | text.filter(bool)),
    st.just(ReplicateCommand()),
    st.builds(ReplicateStreamCommand, word, st.none() | token),
    st.builds(
        UserSyncCommand,
        word,
        word,
        st.none() | word.filter(lambda s: s != "None"),
        st.booleans(),
        token,
    ),
    st.builds(ClearUserSyncCommand, text.filter(bool)),
    st.builds(FederationAckCommand, word, token),
    st.builds(RemoteServerUpCommand, text.filter(bool)),
    st.builds(UserIpCommand, word, text, text, text, st.none() | text, token),
    st.builds(LockReleasedCommand, text, text, text),
    st.builds(NewActiveTaskCommand, text.filter(bool)),
    st.builds(CancelTaskCommand, text.filter(bool)),
)


def same(a: Any, b: Any) -> bool:
    # Command equality plus exact JSON types (1 vs 1.0 vs True) in rows.
    return a == b and json.dumps(list(a), sort_keys=True) == json.dumps(list(b), sort_keys=True)


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow])
@given(commands)
def test_serialize_then_parse_round_trips(cmd: Command) -> None:
    line = serialize(cmd)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    parsed = parse_line(line)
    assert type(parsed) is type(cmd)
    assert same(parsed, cmd)
    # Canonical form: serializing again gives the very same bytes.
    assert serialize(parsed) == line


@settings(max_examples=500)
@given(json_value)
def test_rows_are_encoded_exactly_like_synapse(row: Any) -> None:
    line = serialize(RdataCommand("s", "i", 1, row))
    synapse_json = json.JSONEncoder(allow_nan=False, separators=(",", ":")).encode(row)
    assert line == b"RDATA s i 1 " + synapse_json.encode() + b"\n"


@settings(max_examples=3000)
@given(st.binary(max_size=300))
def test_random_bytes_only_raise_protocol_error(data: bytes) -> None:
    try:
        cmd = parse_line(data)
    except ProtocolError as e:
        assert e.reason and "\n" not in e.reason
    else:
        assert cmd.NAME in ALL_COMMAND_NAMES


def _mutate(line: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    buf = bytearray(line)
    for kind, pos, value in edits:
        if not buf:
            buf.append(value)
            continue
        pos %= len(buf)
        if kind == 0:
            buf[pos] = value
        elif kind == 1:
            del buf[pos]
        elif kind == 2:
            buf.insert(pos, value)
        else:
            del buf[pos:]
    return bytes(buf)


SEEDS = [
    b'RDATA events master 14 ["ev",["$a:hs","!r:hs","m.room.message",null,null,null,null,'
    b"false,false]]",
    b'RDATA caches master batch ["get_user_by_id",["@test:localhost:8823"],1490197670513]',
    b"POSITION events master 53 53",
    b"USER_SYNC worker1 @a:hs DEV start 1700000000000",
    b'USER_IP @a:hs ["syt_token","10.0.0.1","Element/1.0",null,1234]',
    b'LOCK_RELEASED ["worker1","purge","!room:hs"]',
    b"FEDERATION_ACK federation_sender1 42",
    b"SERVER localhost:8823",
    b"REPLICATE ",
]

interesting_bytes = st.sampled_from(
    list(b' "[]{},:\\\n\r0123456789-.eE\x00\x7f\xc3\xff')
) | st.integers(0, 255)


@settings(max_examples=3000)
@given(
    st.sampled_from(SEEDS),
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 10_000), interesting_bytes), max_size=6),
)
def test_mutated_lines_only_raise_protocol_error(seed: bytes, edits: list[Any]) -> None:
    mutated = _mutate(seed, edits)
    try:
        cmd = parse_line(mutated)
    except ProtocolError as e:
        assert e.reason
    else:
        assert cmd.NAME in ALL_COMMAND_NAMES


@settings(max_examples=300)
@given(st.lists(st.binary(max_size=64) | st.sampled_from(SEEDS), max_size=30))
def test_connection_survives_garbage_streams(chunks: list[bytes]) -> None:
    # Whatever arrives, feeding is bounded work that raises nothing; at worst the
    # connection closes with one ERROR line.
    conn = ReplicationConnection.server("hs", max_line_length=128, permissive=True)
    conn.start(0.0)
    conn.data_to_send()
    for chunk in chunks:
        for cmd in conn.receive_data(chunk, 1.0):
            assert cmd.NAME in ALL_COMMAND_NAMES
    out = conn.data_to_send()
    if conn.must_close:
        assert out.startswith(b"ERROR ") and out.count(b"\n") == 1
    else:
        assert out == b""


@settings(max_examples=50)
@given(st.integers(1, 4000))
def test_deep_nesting_is_rejected_not_crashing(depth: int) -> None:
    line = b"RDATA s i 1 " + b"[" * depth + b"]" * depth
    try:
        cmd = parse_line(line)
    except ProtocolError as e:
        assert "not valid JSON" in e.reason
    else:
        assert isinstance(cmd, RdataCommand)
