"""The /sync sections (roomstream.client.sync_sections): the token has one part per
registered section, in registration order, and old (shorter) tokens parse; the notifier's
wake keys come from the sections and agree with a naive reading of each row format."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self

import pytest
from hypothesis import given
from hypothesis import strategies as st

from roomstream.client import sync as sync_module
from roomstream.client.notifier import keys_for_row
from roomstream.client.sync import SyncToken
from roomstream.client.sync_sections import SECTIONS, SyncContext, SyncSection, SyncServices
from roomstream.errors import MatrixError
from roomstream.reading import EventsToken
from roomstream.streams import STREAMS

_positions = st.integers(0, 10**18 - 1)
_events_tokens = st.builds(EventsToken, _positions) | st.builds(
    EventsToken,
    _positions,
    st.dictionaries(st.sampled_from(["w1", "w2", "events_3"]), _positions, min_size=1),
)


def test_sections_are_registered_in_token_order() -> None:
    assert [s.name for s in SECTIONS] == [
        "events",
        "account_data",
        "receipts",
        "to_device",
        "typing",
        "device_lists",
        "presence",
    ]
    assert all(s.stream in STREAMS for s in SECTIONS)


def test_a_token_of_the_five_part_format_parses() -> None:
    token = SyncToken.parse("s12_3_4_5_6")
    assert token.events == EventsToken(12)
    assert [token.position(n) for n in ("account_data", "receipts", "to_device", "typing")] == [
        3,
        4,
        5,
        6,
    ]
    # Written again with every part: the device_lists and presence parts, missing, are 0.
    assert token.position("device_lists") == 0
    assert token.position("presence") == 0
    assert token.to_string() == "s12_3_4_5_6_0_0"


@given(_events_tokens, st.lists(_positions, min_size=6, max_size=6))
def test_tokens_round_trip(events: EventsToken, rest: list[int]) -> None:
    text = "_".join([events.to_string(), *map(str, rest)])
    assert SyncToken.parse(text).to_string() == text
    assert SyncToken.parse(text).events == events


@given(_events_tokens, st.lists(_positions, max_size=5))
def test_missing_parts_are_zero(events: EventsToken, rest: list[int]) -> None:
    """A token issued before later sections existed: their parts are 0."""
    token = SyncToken.parse("_".join([events.to_string(), *map(str, rest)]))
    expected = [*rest, *[0] * (6 - len(rest))]
    names = [s.name for s in SECTIONS[1:]]
    assert [token.position(n) for n in names] == expected


@pytest.mark.parametrize(
    "text", ["s1_2_3_4_5_6_7_8", "s1_x_3_4_5", "s1__3_4_5", "s1_2_3_4_-5", "nope_1", ""]
)
def test_malformed_tokens_are_invalid_param(text: str) -> None:
    with pytest.raises(MatrixError) as raised:
        SyncToken.parse(text)
    assert raised.value.http_status == 400
    assert raised.value.errcode == "M_INVALID_PARAM"


class _Appended(SyncSection):
    """A section registered after the five (as device lists will be)."""

    name = "appended"
    stream = "typing"

    @classmethod
    def from_services(cls, services: SyncServices) -> Self:
        return cls()

    @staticmethod
    def wake_keys(row: Sequence[Any]) -> list[str]:
        return []

    def current_position(self) -> int:
        return 0

    async def collect(self, ctx: SyncContext, since: int | None, upto: int) -> int:
        return upto


def test_appending_a_section_keeps_old_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sync_module, "SECTIONS", (*SECTIONS, _Appended))
    token = SyncToken.parse("s7_1_2_3_4_5_6")
    assert token.position("appended") == 0
    assert token.to_string() == "s7_1_2_3_4_5_6_0"
    assert SyncToken.parse("s7_1_2_3_4_5_6_9").position("appended") == 9


# -- wake keys: the sections against the row formats read naively -----------------------

_id = st.text(alphabet="abc:!@$.", min_size=1, max_size=6)
_opt_id = st.none() | _id
_event_types = st.sampled_from(["m.room.member", "m.room.message", "m.room.name"])


def _naive_keys(stream: str, row: list[Any]) -> list[str]:
    """docs/streams.md's row formats, read field by field."""
    if stream == "events":
        kind, data = row
        if kind == "ev":
            _event_id, room_id, event_type, state_key = data[:4]
            keys = ["r" + room_id]
            if event_type == "m.room.member" and state_key is not None:
                keys.append("u" + state_key)
            return keys
        return ["r" + data[0]]
    if stream == "account_data":
        return ["u" + row[0]]
    if stream in ("device_lists", "presence"):
        # The user's syncs and those of everyone sharing a room with the user.
        return ["u" + row[0], "s" + row[0]]
    if stream in ("receipts", "typing"):
        return ["r" + row[0]]
    if stream == "to_device":
        return ["u" + row[0]] if row[0].startswith("@") else []
    return []


_rows = st.one_of(
    st.tuples(
        st.just("events"),
        st.tuples(
            st.just("ev"),
            st.tuples(_id, _id, _event_types, _opt_id, _opt_id, _opt_id, _opt_id)
            .map(list)
            .map(lambda d: [*d, False, False]),
        ).map(list),
    ),
    st.tuples(
        st.just("events"),
        st.tuples(st.just("state"), st.tuples(_id, _event_types, _id, _opt_id).map(list)).map(list),
    ),
    st.tuples(st.just("account_data"), st.tuples(_id, _opt_id, _id).map(list)),
    st.tuples(
        st.just("receipts"),
        st.tuples(_id, _id, _id, _id, _opt_id, st.just({})).map(list),
    ),
    st.tuples(st.just("to_device"), st.tuples(_id).map(list)),
    st.tuples(st.just("typing"), st.tuples(_id, st.lists(_id)).map(list)),
    st.tuples(
        st.just("presence"),
        st.tuples(
            _id,
            st.sampled_from(["online", "unavailable", "offline"]),
            st.integers(0, 2**50),
            st.integers(0, 2**50),
            st.integers(0, 2**50),
            _opt_id,
            st.booleans(),
        ).map(list),
    ),
    st.tuples(st.just("device_lists"), st.tuples(_id).map(list)),
    st.tuples(st.sampled_from(["caches", "backfill"]), st.lists(_opt_id, max_size=3)),
)


@given(_rows)
def test_wake_keys_agree_with_the_row_formats(stream_row: tuple[str, list[Any]]) -> None:
    stream, row = stream_row
    assert keys_for_row(stream, row) == _naive_keys(stream, row)


@pytest.mark.parametrize(
    ("stream", "row"),
    [("events", ["ev"]), ("events", 5), ("account_data", []), ("typing", ["!r"])],
)
def test_a_malformed_row_wakes_nobody(stream: str, row: Any) -> None:
    assert keys_for_row(stream, row) == []
