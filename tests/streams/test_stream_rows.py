"""Typed stream rows (roomstream.streams.rows): the decoded view of each stream's wire row
round-trips to the same JSON array, and its fields are the registry's wire order."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from roomstream.streams import STREAMS
from roomstream.streams.registry import EVENTS
from roomstream.streams.rows import (
    AccountDataRow,
    DeviceListsRow,
    EventRow,
    PushRulesRow,
    ReceiptsRow,
    StateRow,
    ToDeviceRow,
    TypingRow,
    events_row_from_wire,
)

_text = st.text(max_size=12)
_opt = st.none() | _text

_ROW_TYPES: dict[str, Any] = {
    "account_data": AccountDataRow,
    "device_lists": DeviceListsRow,
    "push_rules": PushRulesRow,
    "receipts": ReceiptsRow,
    "to_device": ToDeviceRow,
    "typing": TypingRow,
}


@pytest.mark.parametrize("stream", sorted(_ROW_TYPES))
def test_row_fields_are_the_registry_wire_order(stream: str) -> None:
    assert _ROW_TYPES[stream]._fields == STREAMS[stream].row_fields


def test_events_kinds_have_the_columns_of_their_tables() -> None:
    ev_table, state_table = EVENTS.tables
    # The ev row renames rejected_reason to rejected (a flag); otherwise the columns.
    assert EventRow._fields == tuple(
        "rejected" if c == "rejected_reason" else c for c in ev_table.columns
    )
    assert StateRow._fields == state_table.columns


@given(st.tuples(_text, _text, _text, _opt, _opt, _opt, _opt, _opt, st.none() | st.integers(0, 1)))
def test_events_ev_row_round_trips_from_the_database_row(db_row: tuple[Any, ...]) -> None:
    wire = EVENTS.tables[0].to_row(db_row)
    row = events_row_from_wire(list(wire))
    assert isinstance(row, EventRow)
    assert row.to_wire() == wire
    assert (row.event_id, row.room_id, row.type, row.state_key) == db_row[:4]
    assert row.rejected is (db_row[7] is not None)
    member = db_row[3] if db_row[2] == "m.room.member" else None
    assert row.member_user_id == member


@given(st.tuples(_text, _text, _text, _opt))
def test_events_state_row_round_trips(db_row: tuple[Any, ...]) -> None:
    wire = EVENTS.tables[1].to_row(db_row)
    row = events_row_from_wire(list(wire))
    assert isinstance(row, StateRow)
    assert row.to_wire() == wire
    assert row.room_id == db_row[0]


@pytest.mark.parametrize(
    "wire",
    [
        ["ev"],
        ["ev", ["$e", "!r"]],
        ["nope", ["!r", "m.room.name", "", "$e"]],
        ["state", ["!r", "m.room.name", "", "$e", "extra"]],
    ],
)
def test_malformed_events_rows_are_refused(wire: list[Any]) -> None:
    with pytest.raises((TypeError, ValueError)):
        events_row_from_wire(wire)


@given(st.sampled_from(sorted(_ROW_TYPES)), st.data())
def test_other_rows_round_trip(stream: str, data: st.DataObject) -> None:
    row_type = _ROW_TYPES[stream]
    wire = data.draw(st.tuples(*(_text for _ in row_type._fields)))
    assert row_type.from_wire(list(wire)).to_wire() == wire


@pytest.mark.parametrize(("entity", "user"), [("@a:hs", "@a:hs"), ("remote.example", None)])
def test_to_device_entity_is_a_local_user_or_a_server(entity: str, user: str | None) -> None:
    assert ToDeviceRow.from_wire([entity]).local_user_id == user
