"""The sliding sync request model (both request shapes, combining configs) and the
bounds of the per-connection memory, without a server."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from roomstream.errors import MatrixError
from roomstream.sliding.connections import ConnectionStore, RoomSent, Snapshot
from roomstream.sliding.request import RequiredState, parse_request

TYPES = ["m.room.name", "m.room.member", "m.room.create", "*"]
KEYS = ["", "@a:x", "@b:x", "*"]
pair = st.tuples(st.sampled_from(TYPES), st.sampled_from(KEYS))
pairs = st.frozensets(pair, max_size=4)
required = st.builds(RequiredState, pairs, pairs, st.booleans())


def naive(state: RequiredState, event_type: str, state_key: str) -> bool:
    def hit(items: frozenset[tuple[str, str]]) -> bool:
        return any(t in ("*", event_type) and k in ("*", state_key) for t, k in items)

    return hit(state.include) and not hit(state.exclude)


@given(st.lists(required, min_size=1, max_size=4))
def test_combined_required_state_is_the_union_of_what_each_returns(
    configs: list[RequiredState],
) -> None:
    combined = configs[0]
    for other in configs[1:]:
        combined = combined.union(other)
    for event_type in TYPES[:3]:
        for state_key in KEYS[:3]:
            expected = any(naive(c, event_type, state_key) for c in configs)
            assert combined.matches(event_type, state_key) == expected
    assert combined.lazy_members == any(c.lazy_members for c in configs)


def test_both_request_shapes_mean_the_same() -> None:
    synapse = parse_request(
        {
            "conn_id": "main",
            "lists": {
                "all": {
                    "ranges": [[0, 19]],
                    "timeline_limit": 1,
                    "required_state": [["m.room.member", "$LAZY"], ["m.room.member", "$ME"]],
                    "filters": {"is_invite": True},
                }
            },
        },
        {"pos": "ab_3", "timeout": "30000"},
    )
    proposal = parse_request(
        {
            "conn_id": "main",
            "pos": "ab_3",
            "timeout": 30000,
            "lists": {
                "all": {
                    "range": [0, 19],
                    "timeline_limit": 1,
                    "required_state": {
                        "include": [{"type": "m.room.member", "state_key": "$ME"}],
                        "lazy_members": True,
                    },
                    "filters": {"is_invited": True},
                }
            },
        },
        {},
    )
    assert synapse == proposal
    state = synapse.lists["all"].config.required_state.for_user("@me:x")
    assert state.lazy_members and state.matches("m.room.member", "@me:x")
    assert not state.matches("m.room.member", "@other:x")


@pytest.mark.parametrize(
    "body",
    [
        {"lists": {"a": {"ranges": [[3, 2]], "timeline_limit": 1}}},
        {"lists": {"a": {"range": [0], "timeline_limit": 1}}},
        {"lists": {"a": {"timeline_limit": True}}},
        {"lists": {"a": {"timeline_limit": 1, "required_state": {"include": [5]}}}},
        {"lists": {f"l{i}": {"timeline_limit": 1} for i in range(101)}},
        {"set_presence": "busy"},
        {"timeout": -1},
    ],
)
def test_bad_requests_are_invalid_param(body: dict[str, object]) -> None:
    with pytest.raises(MatrixError) as caught:
        parse_request(body, {})
    assert (caught.value.http_status, caught.value.errcode) == (400, "M_INVALID_PARAM")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def snapshot(state_entries: int = 0) -> Snapshot:
    sent = RoomSent(
        "join", 1, {("m.room.member", f"@u{i}:x"): "$e" for i in range(state_entries)}, {}
    )
    return Snapshot({}, {"!r:x": sent})


def unknown(store: ConnectionStore, key: tuple[str, str, str], pos: str) -> bool:
    try:
        store.resume(key, pos)
    except MatrixError as exc:
        assert (exc.http_status, exc.errcode) == (400, "M_UNKNOWN_POS")
        return True
    return False


def test_confirmed_pos_drops_older_snapshots_and_retries_work() -> None:
    store = ConnectionStore()
    key = ("@a:x", "DEV", "main")
    connection, _ = store.start(key)
    first = store.commit(key, connection, snapshot())
    connection, _ = store.resume(key, first)
    second = store.commit(key, connection, snapshot())
    # A retry of the first pos (the response to it was lost) still works...
    connection, _ = store.resume(key, first)
    retried = store.commit(key, connection, snapshot())
    # ...and using the newest drops everything before it.
    store.resume(key, retried)
    assert unknown(store, key, first) and unknown(store, key, second)
    assert not unknown(store, key, retried)
    assert unknown(store, ("@a:x", "DEV", "other"), retried)
    assert unknown(store, key, "garbage")


def test_connections_are_bounded() -> None:
    clock = Clock()
    store = ConnectionStore(
        max_connections=5, max_per_device=2, idle_seconds=60, max_tracked=100, clock=clock
    )
    positions = {}
    for device in range(3):
        for conn in range(3):
            key = ("@a:x", f"D{device}", f"c{conn}")
            connection, _ = store.start(key)
            positions[key] = store.commit(key, connection, snapshot())
    assert len(store) <= 5
    # Per device, only the two newest connections are left.
    assert unknown(store, ("@a:x", "D2", "c0"), positions[("@a:x", "D2", "c0")])
    assert not unknown(store, ("@a:x", "D2", "c2"), positions[("@a:x", "D2", "c2")])
    # Idle connections expire.
    clock.now += 61
    assert unknown(store, ("@a:x", "D2", "c2"), positions[("@a:x", "D2", "c2")])
    assert len(store) == 0
    # A connection that would track too much is dropped: its next pos is unknown.
    key = ("@a:x", "D9", "big")
    connection, _ = store.start(key)
    pos = store.commit(key, connection, snapshot(state_entries=200))
    assert unknown(store, key, pos)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
fields = st.sampled_from(
    ["lists", "room_subscriptions", "extensions", "conn_id", "pos", "timeout", "set_presence"]
)
list_fields = st.sampled_from(
    ["range", "ranges", "timeline_limit", "required_state", "filters", "bogus"]
)


@given(
    st.dictionaries(fields, json_values, max_size=4),
    st.dictionaries(list_fields, json_values, max_size=5),
    st.dictionaries(st.sampled_from(["pos", "timeout"]), st.text(max_size=6), max_size=2),
)
def test_any_body_is_a_request_or_a_400(
    top: dict[str, object], one_list: dict[str, object], query: dict[str, str]
) -> None:
    for body in (top, dict(top, lists={"l": one_list})):
        try:
            parse_request(body, query)
        except MatrixError as exc:
            assert exc.http_status == 400
