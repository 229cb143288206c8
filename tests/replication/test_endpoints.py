"""The declarative internal endpoints (roomstream.replication.endpoints): their bodies are
exactly those earlier releases sent (an oracle written out by hand, field by field), they
read back what they encode, and they refuse bodies the hand-written handlers refused."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from roomstream.errors import Codes, MatrixError
from roomstream.replication import endpoints as ep

IDENT = st.text(st.characters(codec="utf-8", categories=["L", "N"]), min_size=1, max_size=20)
USER = IDENT.map(lambda s: "@" + s)
ROOM = IDENT.map(lambda s: "!" + s)
EVENT = IDENT.map(lambda s: "$" + s)
TEXT = st.text(max_size=20)
CONTENT = st.dictionaries(TEXT, st.integers() | TEXT, max_size=3)
MESSAGES = st.dictionaries(USER, st.dictionaries(IDENT, CONTENT, max_size=2), max_size=2)


def _or_none(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


# (call, the body the hand-written InternalHttpClient methods of earlier releases sent)
@st.composite
def calls(draw: st.DrawFn) -> tuple[ep.InternalEndpoint[Any, Any], Any, dict[str, Any]]:
    which = draw(st.sampled_from([e.name for e in ep.CLIENT_WRITES]))
    if which == "create_room":
        creator, request = draw(USER), draw(CONTENT)
        return (
            ep.CREATE_ROOM,
            ep.CreateRoomCall(creator, request),
            {
                "creator": creator,
                "request": request,
            },
        )
    if which == "send":
        room, user, device, txn, kind, content = (
            draw(s) for s in (ROOM, USER, TEXT, TEXT, IDENT, CONTENT)
        )
        redacts = draw(_or_none(EVENT))
        body = {
            "room_id": room,
            "user_id": user,
            "device_id": device,
            "txn_id": txn,
            "type": kind,
            "content": content,
        }
        if redacts is not None:
            body["redacts"] = redacts
        call = ep.SendCall(room, user, device, txn, kind, content, redacts)
        return ep.SEND, call, body
    if which == "end_sessions":
        user, device = draw(USER), draw(_or_none(TEXT))
        body = {"user_id": user, "device_id": device}
        return ep.END_SESSIONS, ep.EndSessionsCall(user, device), body
    if which == "account_data":
        user, room, kind, content = draw(USER), draw(_or_none(ROOM)), draw(IDENT), draw(CONTENT)
        body = {"user_id": user, "room_id": room, "type": kind, "content": content}
        return ep.ACCOUNT_DATA, ep.AccountDataCall(user, room, kind, content), body
    if which == "receipt":
        room, kind, user, event, thread = (
            draw(s) for s in (ROOM, IDENT, USER, EVENT, _or_none(IDENT))
        )
        body = {
            "room_id": room,
            "receipt_type": kind,
            "user_id": user,
            "event_id": event,
            "thread_id": thread,
        }
        ts = draw(_or_none(st.integers(0, 2**53)))
        if ts is not None:  # absent when None (older senders send none)
            body["ts"] = ts
        return ep.RECEIPT, ep.ReceiptCall(room, kind, user, event, thread, ts), body
    if which == "to_device":
        sender, kind, messages = draw(USER), draw(IDENT), draw(MESSAGES)
        transaction = draw(_or_none(st.tuples(TEXT, TEXT)))
        body = {"sender": sender, "type": kind, "messages": messages}
        if transaction is not None:
            body["sender_device"], body["txn_id"] = transaction
        call = ep.ToDeviceCall(sender, kind, messages, *(transaction or (None, None)))
        return ep.TO_DEVICE, call, body
    room, user, typing = draw(ROOM), draw(USER), draw(st.booleans())
    timeout = draw(st.integers(0, 2**53))
    body = {"room_id": room, "user_id": user, "typing": typing, "timeout": timeout}
    return ep.TYPING, ep.TypingCall(room, user, typing, timeout), body


@given(calls())
def test_bodies_are_those_of_earlier_releases_and_read_back(
    case: tuple[ep.InternalEndpoint[Any, Any], Any, dict[str, Any]],
) -> None:
    endpoint, call, body = case
    assert endpoint.encode(call) == body
    assert endpoint.parse(body) == call
    # absent and null are read alike
    assert endpoint.parse({k: v for k, v in body.items() if v is not None}) == call


def test_paths_and_streams_are_those_of_earlier_releases() -> None:
    assert {(e.path, e.stream, e.answer) for e in ep.CLIENT_WRITES} == {
        ("/client/create_room", "events", "room_id"),
        ("/client/send", "events", "event_id"),
        ("/client/end_sessions", "caches", None),
        ("/client/account_data", "account_data", None),
        ("/client/receipt", "receipts", None),
        ("/client/to_device", "to_device", None),
        ("/client/typing", "typing", None),
        # Added with end-to-end encryption: body {"op", "args"}, answer {"result"}.
        ("/client/e2e_keys", "device_lists", "result"),
        # Added with presence: a device's presence for the presence writer.
        ("/client/presence", "presence", None),
        # Added with pushers: POST /pushers/set for the pushers writer.
        ("/client/pusher", "pushers", None),
        # Added with the push_rules stream: an edit of a user's rules for its writer.
        ("/client/push_rule_edit", "push_rules", None),
        # Added with pushers going with their device: a deleted device, for their writer.
        ("/client/device_pushers_removed", "pushers", None),
    }
    assert ep.SEND.encode_answer("$e") == {"event_id": "$e"}
    assert ep.TYPING.encode_answer(None) == {}
    assert ep.CREATE_ROOM.decode_answer({"room_id": "!r"}) == "!r"


TYPING = {"room_id": "!r", "user_id": "@u", "typing": True, "timeout": 5}
TO_DEVICE = {"sender": "@u", "type": "m.t", "messages": {"@v": {"D": {}}}}


@pytest.mark.parametrize(
    ("endpoint", "body", "errcode"),
    [
        (ep.TYPING, {**TYPING, "room_id": None}, Codes.MISSING_PARAM),
        (ep.TYPING, {**TYPING, "room_id": 5}, Codes.BAD_JSON),
        (ep.TYPING, {**TYPING, "room_id": "#r"}, Codes.INVALID_PARAM),
        (ep.TYPING, {**TYPING, "room_id": "!r\x00"}, Codes.INVALID_PARAM),
        (ep.TYPING, {**TYPING, "typing": 1}, Codes.BAD_JSON),
        (ep.TYPING, {**TYPING, "timeout": True}, Codes.BAD_JSON),
        (ep.TYPING, {**TYPING, "timeout": -1}, Codes.INVALID_PARAM),
        (ep.TYPING, {**TYPING, "timeout": 2**53 + 1}, Codes.INVALID_PARAM),
        (ep.TO_DEVICE, {**TO_DEVICE, "messages": {"@v": []}}, Codes.BAD_JSON),
        (ep.TO_DEVICE, {**TO_DEVICE, "messages": {"@v": {"D": 1}}}, Codes.BAD_JSON),
        (ep.TO_DEVICE, {**TO_DEVICE, "messages": {"": {"D": {}}}}, Codes.BAD_JSON),
        (ep.TO_DEVICE, {**TO_DEVICE, "txn_id": "t"}, Codes.MISSING_PARAM),
        (ep.TO_DEVICE, {**TO_DEVICE, "txn_id": 1, "sender_device": "D"}, Codes.BAD_JSON),
        (ep.SEND, {"room_id": "!r", "user_id": "@u"}, Codes.MISSING_PARAM),
        (
            ep.RECEIPT,
            {"room_id": "!r", "receipt_type": "m.read", "user_id": "@u"},
            "M_MISSING_PARAM",
        ),
        (
            ep.ACCOUNT_DATA,
            {"user_id": "@u", "room_id": "#a", "type": "t", "content": {}},
            Codes.INVALID_PARAM,
        ),
        (ep.CREATE_ROOM, {"creator": "@u", "request": []}, Codes.BAD_JSON),
    ],
)
def test_bad_bodies_are_refused_with_a_400(
    endpoint: ep.InternalEndpoint[Any, Any], body: dict[str, Any], errcode: str
) -> None:
    with pytest.raises(MatrixError) as caught:
        endpoint.parse(body)
    assert (caught.value.http_status, caught.value.errcode) == (400, errcode)


# -- the instance's own endpoints (the first routes of the internal API) --------------


HISTORICAL_USER = st.from_regex(r"@[a-z0-9._=/-]{1,20}:[a-z.]{1,10}", fullmatch=True)


@given(
    room=ROOM,
    sender=HISTORICAL_USER,
    kind=IDENT,
    content=CONTENT,
    state_key=_or_none(TEXT.filter(lambda s: "\x00" not in s)),
    redacts=_or_none(EVENT),
)
def test_send_event_is_the_request_of_earlier_releases(
    room: str,
    sender: str,
    kind: str,
    content: dict[str, Any],
    state_key: str | None,
    redacts: str | None,
) -> None:
    call = ep.SendEventCall(room, sender, kind, content, state_key, redacts)
    # What InternalHttpClient.send_event of earlier releases sent: the room quoted whole
    # in the path; state_key and redacts only when given.
    body: dict[str, Any] = {"sender": sender, "type": kind, "content": content}
    if state_key is not None:
        body["state_key"] = state_key
    if redacts is not None:
        body["redacts"] = redacts
    assert ep.SEND_EVENT.url(call) == f"/rooms/{quote(room, safe='')}/send_event"
    assert ep.SEND_EVENT.encode(call) == body
    assert ep.SEND_EVENT.parse(body, {"room_id": room}) == call


def test_the_instance_endpoints_are_those_of_earlier_releases() -> None:
    assert [(e.method, e.path, e.stream) for e in ep.INSTANCE_ENDPOINTS] == [
        ("GET", "/health", None),
        ("GET", "/streams/{stream}/updates", None),
        ("POST", "/rooms/{room_id}/send_event", "events"),
        ("POST", "/create_room", "events"),
        # Added for federation in a cluster (issue 22): new routes, the old ones unchanged.
        ("POST", "/rooms/{room_id}/federation", "events"),
        ("POST", "/rooms/{room_id}/remote_join", "events"),
    ]
    assert ep.HEALTH.url(ep.HealthCall()) == "/health"
    assert ep.HEALTH.encode(ep.HealthCall()) is None  # a GET has no body
    assert ep.HEALTH.parse({"x": "1"}) == ep.HealthCall()
    doc = {"instance": "w1", "status": "ok", "positions": {}}
    assert ep.HEALTH.encode_answer(doc) == doc == ep.HEALTH.decode_answer(doc)
    updates = ep.StreamUpdatesCall(stream="typing", writer="w1", from_token=-1, upto=9, limit=5)
    assert ep.STREAM_UPDATES.url(updates) == (
        "/streams/typing/updates?writer=w1&from=-1&upto=9&limit=5"
    )
    query = {"writer": "w1", "from": "-1", "upto": "9", "limit": "5"}
    assert ep.STREAM_UPDATES.parse(query, {"stream": "typing"}) == updates
    assert ep.STREAM_UPDATES.parse({"from": "0"}, {"stream": "typing"}) == ep.StreamUpdatesCall(
        stream="typing", writer=None, from_token=0, upto=None, limit=1000
    )
    # create_room sends its name even when None (as null); absent reads as null.
    create = ep.CreateNamedRoomCall("@u:x", None)
    assert ep.CREATE_NAMED_ROOM.encode(create) == {"creator": "@u:x", "name": None}
    assert ep.CREATE_NAMED_ROOM.parse({"creator": "@u:x"}) == create
    assert ep.CREATE_NAMED_ROOM.decode_answer({"room_id": "!r"}) == "!r"
    assert ep.SEND_EVENT.parse(
        {"sender": "@u:x", "type": "t"}, {"room_id": "!r"}
    ) == ep.SendEventCall("!r", "@u:x", "t", {})


SEND_EVENT = {"sender": "@u:x", "type": "m.t", "content": {}}


@pytest.mark.parametrize(
    ("endpoint", "values", "path", "errcode"),
    [
        (ep.SEND_EVENT, SEND_EVENT, {"room_id": "!"}, Codes.INVALID_PARAM),
        (ep.SEND_EVENT, SEND_EVENT, {"room_id": "r"}, Codes.INVALID_PARAM),
        (ep.SEND_EVENT, SEND_EVENT, {"room_id": "!r\x01"}, Codes.INVALID_PARAM),
        (ep.SEND_EVENT, {**SEND_EVENT, "sender": None}, {"room_id": "!r"}, Codes.MISSING_PARAM),
        (ep.SEND_EVENT, {**SEND_EVENT, "sender": 5}, {"room_id": "!r"}, Codes.MISSING_PARAM),
        (ep.SEND_EVENT, {**SEND_EVENT, "sender": "@u"}, {"room_id": "!r"}, Codes.INVALID_PARAM),
        (ep.SEND_EVENT, {**SEND_EVENT, "type": True}, {"room_id": "!r"}, Codes.MISSING_PARAM),
        (ep.SEND_EVENT, {**SEND_EVENT, "type": ""}, {"room_id": "!r"}, Codes.INVALID_PARAM),
        (ep.SEND_EVENT, {**SEND_EVENT, "content": None}, {"room_id": "!r"}, Codes.BAD_JSON),
        (ep.SEND_EVENT, {**SEND_EVENT, "content": "x"}, {"room_id": "!r"}, Codes.BAD_JSON),
        (ep.SEND_EVENT, {**SEND_EVENT, "state_key": 1}, {"room_id": "!r"}, Codes.BAD_JSON),
        (ep.SEND_EVENT, {**SEND_EVENT, "state_key": "\x00"}, {"room_id": "!r"}, "M_INVALID_PARAM"),
        (ep.SEND_EVENT, {**SEND_EVENT, "redacts": "!e"}, {"room_id": "!r"}, Codes.INVALID_PARAM),
        (ep.CREATE_NAMED_ROOM, {}, {}, Codes.MISSING_PARAM),
        (ep.CREATE_NAMED_ROOM, {"creator": ["@u:x"]}, {}, Codes.MISSING_PARAM),
        (ep.CREATE_NAMED_ROOM, {"creator": "@u:x", "name": {}}, {}, Codes.MISSING_PARAM),
        (ep.STREAM_UPDATES, {}, {"stream": "typing"}, Codes.MISSING_PARAM),
        (ep.STREAM_UPDATES, {"from": "x"}, {"stream": "typing"}, Codes.INVALID_PARAM),
        (ep.STREAM_UPDATES, {"from": "1e3"}, {"stream": "typing"}, Codes.INVALID_PARAM),
        (ep.STREAM_UPDATES, {"from": "--1"}, {"stream": "typing"}, Codes.INVALID_PARAM),
        (ep.STREAM_UPDATES, {"from": "9" * 21}, {"stream": "typing"}, Codes.INVALID_PARAM),
        (ep.STREAM_UPDATES, {"from": "0", "upto": ""}, {"stream": "typing"}, "M_INVALID_PARAM"),
        (ep.STREAM_UPDATES, {"from": "0", "limit": "0"}, {"stream": "typing"}, "M_INVALID_PARAM"),
        (ep.STREAM_UPDATES, {"from": "0", "limit": "10001"}, {"stream": "t"}, "M_INVALID_PARAM"),
    ],
)
def test_bad_requests_to_the_instance_endpoints_are_refused_with_a_400(
    endpoint: ep.InternalEndpoint[Any, Any],
    values: dict[str, Any],
    path: dict[str, str],
    errcode: str,
) -> None:
    with pytest.raises(MatrixError) as caught:
        endpoint.read_path(path)
        endpoint.parse(values, path)
    assert (caught.value.http_status, caught.value.errcode) == (400, errcode)


def test_a_federation_room_request_round_trips_and_is_checked() -> None:
    call = ep.FederationRoomCall(
        "!r:a.test", "a.test:8448", "send_join", {"event_id": "$e", "pdu": {"type": "x"}}
    )
    assert ep.FEDERATION_ROOM.url(call) == "/rooms/%21r%3Aa.test/federation"
    body = ep.FEDERATION_ROOM.encode(call)
    assert body == {
        "origin": "a.test:8448",
        "op": "send_join",
        "args": {"event_id": "$e", "pdu": {"type": "x"}},
    }
    assert ep.FEDERATION_ROOM.parse(body, {"room_id": "!r:a.test"}) == call
    assert ep.FEDERATION_ROOM.room_owned and ep.FEDERATION_ROOM.stream == "events"
    # The writer answers what the Server-Server API answers, whole.
    assert ep.FEDERATION_ROOM.decode_answer({"pdus": {}}) == {"pdus": {}}
    with pytest.raises(MatrixError) as bad_op:
        ep.FEDERATION_ROOM.parse({**body, "op": "state"}, {"room_id": "!r:a.test"})
    assert bad_op.value.errcode == "M_INVALID_PARAM"
    with pytest.raises(MatrixError) as bad_origin:
        ep.FEDERATION_ROOM.parse({**body, "origin": "not a server"}, {"room_id": "!r:a.test"})
    assert bad_origin.value.errcode == "M_INVALID_PARAM"
    with pytest.raises(MatrixError) as bad_args:
        ep.FEDERATION_ROOM.parse({**body, "args": []}, {"room_id": "!r:a.test"})
    assert bad_args.value.errcode == "M_BAD_JSON"


def test_a_remote_join_round_trips_and_is_checked() -> None:
    call = ep.RemoteJoinCall("!r:a.test", "@bob:b.test", ["a.test", "c.test:8448"], {})
    body = ep.REMOTE_JOIN.encode(call)
    assert body == {
        "user_id": "@bob:b.test",
        "servers": ["a.test", "c.test:8448"],
        "content": {},
    }
    assert ep.REMOTE_JOIN.parse(body, {"room_id": "!r:a.test"}) == call
    assert ep.REMOTE_JOIN.decode_answer({}) is None
    for servers in (["bad server"], [1], "a.test"):
        with pytest.raises(MatrixError) as bad:
            ep.REMOTE_JOIN.parse({**body, "servers": servers}, {"room_id": "!r:a.test"})
        assert bad.value.errcode in ("M_INVALID_PARAM", "M_BAD_JSON")
