"""Events as clients see them: the one function that turns a stored event into the
Client-Server API's event format, and the one encoding of it.

Every read of :mod:`roomstream.reading` (sync, latest rooms, pagination, context,
members, single events) serves events through :func:`client_event`, so the same event
shown to the same viewer is the same JSON wherever it appears (only ``unsigned.age``,
"milliseconds since it was sent", moves with the clock; pass ``now_ms=None`` to leave it
out). :func:`encode_client_event` gives the bytes: keys sorted, no whitespace.

The format (spec, Client-Server API, "Room event format"): ``event_id``, ``room_id``,
``type``, ``state_key`` (state events only), ``sender``, ``origin_server_ts``,
``content``, and ``unsigned`` with ``age``, ``redacted_because``, ``prev_content`` and
``replaces_state`` (state events that replaced an earlier one), ``transaction_id`` (only
for the device that sent it). Redaction events of room versions before 11 keep their
top-level ``redacts`` (later versions get it copied from the content, for clients that
read it there, as Synapse does). Federation-only keys (``auth_events``, ``prev_events``,
``depth``, ``hashes``, ``signatures``, ``origin``, ``prev_state``, ``membership``) are
never included.

A redacted event is served pruned by its room version's redaction algorithm
(:func:`roomstream.events.redaction.redact`), with ``unsigned.redacted_because`` holding
the redaction event in this same format (without its own ``unsigned``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from roomstream.events.model import Event
from roomstream.events.redaction import redact
from roomstream.events.types import EventTypes

__all__ = [
    "ClientEvent",
    "FormattedEvent",
    "client_event",
    "encode_client_event",
    "format_event",
    "with_viewer_fields",
]

ClientEvent = dict[str, Any]
"""An event in the client format (JSON-ready)."""


def _base(event: Event, data: Mapping[str, Any]) -> ClientEvent:
    content = data.get("content")
    if not isinstance(content, Mapping):
        content = {}
    result: ClientEvent = {
        "content": dict(content),
        "event_id": event.event_id,
        "origin_server_ts": data.get("origin_server_ts", 0),
        "room_id": event.room_id,
        "sender": data.get("sender"),
        "type": data.get("type"),
    }
    if event.state_key is not None:
        result["state_key"] = event.state_key
    if event.type == EventTypes.REDACTION:
        # From room version 11 redacts lives in the content; clients (matrix-js-sdk,
        # matrix-nio) read the top-level key, so it is copied there too, as Synapse does.
        redacts = data.get("redacts", content.get("redacts"))
        if isinstance(redacts, str):
            result["redacts"] = redacts
    return result


@dataclass(frozen=True, slots=True)
class FormattedEvent:
    """The part of an event's client format that depends only on the event and its
    redaction: what readers cache, once per event, and copy per viewer.

    Invariants: ``base`` is :func:`client_event` of the event without the viewer's
    ``unsigned`` fields (``unsigned`` holds only ``redacted_because``, when redacted);
    nothing may mutate it, nor ``base["content"]``, which every copy shares.
    ``redacted_by`` is the redaction ``base`` was pruned for (None: not redacted);
    ``origin_server_ts`` is the event's, as an int (for ``unsigned.age``).
    """

    base: ClientEvent
    redacted_by: str | None
    origin_server_ts: int
    is_state: bool


def format_event(event: Event, redacted_because: Event | None = None) -> FormattedEvent:
    """The viewer-independent part of ``event``'s client format (see :func:`client_event`)."""
    if redacted_because is None:
        base = _base(event, event.data)
    else:
        base = _base(event, redact(event.data, event.room_version))
        base["unsigned"] = {"redacted_because": _base(redacted_because, redacted_because.data)}
    timestamp = event.data.get("origin_server_ts", 0)
    return FormattedEvent(
        base,
        None if redacted_because is None else redacted_because.event_id,
        timestamp if type(timestamp) is int else int(timestamp),
        event.state_key is not None,
    )


def client_event(
    event: Event,
    *,
    redacted_because: Event | None = None,
    prev_content: Mapping[str, Any] | None = None,
    replaces_state: str | None = None,
    transaction_id: str | None = None,
    now_ms: int | None = None,
) -> ClientEvent:
    """``event`` in the client format.

    ``redacted_because``: the accepted redaction of ``event``, if any (the event is then
    pruned). ``prev_content``/``replaces_state``: the content and ID of the state event
    this one replaced (already pruned by the caller if that one is redacted).
    ``transaction_id``: only when the viewer is the device that sent the event.
    ``now_ms``: the time to compute ``unsigned.age`` from (left out when None).
    """
    return with_viewer_fields(
        format_event(event, redacted_because),
        prev_content=prev_content,
        replaces_state=replaces_state,
        transaction_id=transaction_id,
        now_ms=now_ms,
    )


def with_viewer_fields(
    formatted: FormattedEvent,
    *,
    prev_content: Mapping[str, Any] | None = None,
    replaces_state: str | None = None,
    transaction_id: str | None = None,
    now_ms: int | None = None,
) -> ClientEvent:
    """A new dict: ``formatted.base`` with the ``unsigned`` fields that depend on the
    time, the event's place in the state, and the viewer. Shallow: ``content`` and
    ``prev_content`` are shared with the cache (read-only).

    Called once per event served, so it does the least it can: one dict copy, plus one
    ``unsigned`` dict when there is something to put in it.
    """
    base = formatted.base
    result = base.copy()
    if replaces_state is None or not formatted.is_state:
        if transaction_id is None:
            if now_ms is None:
                return result
            if "unsigned" not in base:  # the usual case: only the age
                result["unsigned"] = {"age": max(0, now_ms - formatted.origin_server_ts)}
                return result
        replaces_state = None
    unsigned: dict[str, Any] = {}
    if now_ms is not None:
        unsigned["age"] = max(0, now_ms - formatted.origin_server_ts)
    unsigned.update(base.get("unsigned", ()))
    if replaces_state is not None:
        unsigned["replaces_state"] = replaces_state
        if prev_content is not None:
            unsigned["prev_content"] = prev_content
    if transaction_id is not None:
        unsigned["transaction_id"] = transaction_id
    if unsigned:
        result["unsigned"] = unsigned
    return result


def encode_client_event(event: ClientEvent) -> bytes:
    """The bytes of a client event: sorted keys, compact."""
    return orjson.dumps(event, option=orjson.OPT_SORT_KEYS)
