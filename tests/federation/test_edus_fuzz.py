"""Fuzzed EDU contents: ``on_edu`` never raises, and whatever it passes on speaks only
for the origin's users (typing, receipts, presence, device lists, to-device senders)
and delivers to-device messages only to this server's users. The services are fakes
that record; every room counts as one the origin is in, so the checks past it run."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roomstream.client.presence import UserPresence
from roomstream.client.typing import TypingState, TypingWriter
from roomstream.federation.edus import FEDERATION_TYPING_TIMEOUT_MS, FederationEdus
from roomstream.federation.membership import server_of
from roomstream.federation.remote_devices import DeviceListUpdate

ORIGIN = "remote.test"
LOCAL = "local.test"
EDU_TYPES = [
    "m.typing",
    "m.receipt",
    "m.presence",
    "m.device_list_update",
    "m.signing_key_update",
    "m.direct_to_device",
    "m.unknown",
]

user_ids = st.sampled_from(
    [f"@bob:{ORIGIN}", "@eve:other.test", f"@alice:{LOCAL}", "bob", "@:", "@x:remote.test:1"]
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True),
    st.text(max_size=5),
    user_ids,
    st.sampled_from(["online", "offline", "m.read", "!room:x", "*", "main"]),
)
keys = st.one_of(
    st.text(max_size=4),
    user_ids,
    st.sampled_from(
        [
            "room_id",
            "user_id",
            "typing",
            "push",
            "presence",
            "event_ids",
            "data",
            "thread_id",
            "sender",
            "type",
            "message_id",
            "messages",
            "device_id",
            "stream_id",
            "prev_id",
            "deleted",
            "keys",
            "master_key",
            "self_signing_key",
            "last_active_ago",
            "m.read",
            "!room:x",
            "*",
        ]
    ),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=5),
    max_leaves=25,
)


class Recorder:
    def __init__(self) -> None:
        self.spoken_for: list[str] = []
        self.recipients: list[str] = []

    async def set_typing(self, room_id: str, user_id: str, typing: bool, timeout_ms: int) -> None:
        assert isinstance(room_id, str) and isinstance(typing, bool) and timeout_ms > 0
        self.spoken_for.append(user_id)

    async def put_receipt(
        self,
        room_id: str,
        receipt_type: str,
        user_id: str,
        event_id: str,
        thread: str | None,
        ts: int | None,
    ) -> None:
        assert all(isinstance(v, str) for v in (room_id, receipt_type, event_id))
        assert thread is None or isinstance(thread, str)
        assert ts is None or (type(ts) is int and 0 <= ts < 2**53)
        self.spoken_for.append(user_id)

    async def send_to_device(
        self,
        sender: str,
        event_type: str,
        messages: Mapping[str, Mapping[str, Any]],
        transaction: tuple[str, str] | None,
    ) -> None:
        assert isinstance(event_type, str) and transaction is not None
        self.spoken_for.append(sender)
        self.recipients.extend(messages)
        for by_device in messages.values():
            assert all(isinstance(m, dict) for m in by_device.values())

    async def put_presence(self, states: Sequence[UserPresence]) -> None:
        for state in states:
            assert state.state in ("online", "unavailable", "offline")
            assert state.last_active_ts >= 0
            self.spoken_for.append(state.user_id)

    async def is_host_in_room(self, room_id: str, server_name: str) -> bool:
        return True

    async def apply_update(self, update: DeviceListUpdate) -> bool:
        assert update.stream_id >= 0 and all(p >= 0 for p in update.prev_ids)
        self.spoken_for.append(update.user_id)
        return True

    async def apply_signing_keys(self, user_id: str, content: Mapping[str, Any]) -> bool:
        self.spoken_for.append(user_id)
        return True


def handler(recorder: Recorder) -> FederationEdus:
    return FederationEdus(
        LOCAL,
        None,  # type: ignore[arg-type]  # never reached: rooms and device lists are fakes
        set_typing=recorder.set_typing,
        put_receipt=recorder.put_receipt,
        send_to_device=recorder.send_to_device,
        put_presence=recorder.put_presence,
        device_lists=recorder,
        rooms=recorder,
        clock_ms=lambda: 1_700_000_000_000,
    )


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edu_type=st.sampled_from(EDU_TYPES), content=json_values)
def test_fuzzed_edus_never_raise_and_speak_only_for_the_origin(edu_type: str, content: Any) -> None:
    recorder = Recorder()
    asyncio.run(handler(recorder).on_edu(ORIGIN, edu_type, content))
    assert all(server_of(u) == ORIGIN for u in recorder.spoken_for), recorder.spoken_for
    assert all(server_of(u) == LOCAL for u in recorder.recipients), recorder.recipients


@settings(max_examples=200, deadline=None)
@given(
    room=st.sampled_from(["!r:x", "!s:x"]),
    user=user_ids,
    typing=st.one_of(st.booleans(), scalars),
)
def test_well_formed_typing_from_the_origin_is_passed_on(room: str, user: Any, typing: Any) -> None:
    """The oracle: passed on iff the user is the origin's and ``typing`` a boolean."""
    recorder = Recorder()
    content = {"room_id": room, "user_id": user, "typing": typing}
    asyncio.run(handler(recorder).on_edu(ORIGIN, "m.typing", content))
    expected = isinstance(typing, bool) and server_of(user) == ORIGIN
    assert recorder.spoken_for == ([user] if expected else [])


def test_a_failing_service_is_logged_not_raised() -> None:
    recorder = Recorder()

    async def broken(*args: Any) -> None:
        raise RuntimeError("database down")

    edus = handler(recorder)
    edus._set_typing = broken
    content = {"room_id": "!r:x", "user_id": f"@bob:{ORIGIN}", "typing": True}
    asyncio.run(edus.on_edu(ORIGIN, "m.typing", content))


class FakeTime:
    """A clock and ``call_later`` driven by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def clock(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Any) -> Any:
        return asyncio.get_running_loop().call_later(3600, callback)  # fired by hand


def test_remote_typing_times_out_after_the_federation_timeout() -> None:
    """Bob's server says he types and then nothing: he stops typing 60 s later (Synapse's
    ``FEDERATION_TIMEOUT``), not before."""
    time = FakeTime()
    state = TypingState()
    tokens = itertools.count(1)
    writer = TypingWriter(state, lambda rows: next(tokens), time.clock, time.call_later)
    recorder = Recorder()
    edus = handler(recorder)

    async def set_typing(room_id: str, user_id: str, typing: bool, timeout_ms: int) -> None:
        writer.set_typing(room_id, user_id, typing, timeout_ms)

    edus._set_typing = set_typing
    bob = f"@bob:{ORIGIN}"

    async def scenario() -> None:
        await edus.on_edu(ORIGIN, "m.typing", {"room_id": "!r:x", "user_id": bob, "typing": True})
        time.now += FEDERATION_TYPING_TIMEOUT_MS / 1000 - 0.5
        writer.expire()
        assert state.changed(["!r:x"], 0) == {"!r:x": [bob]}
        time.now += 1
        writer.expire()
        assert state.changed(["!r:x"], 0) == {"!r:x": []}
        writer.close()

    asyncio.run(scenario())


def test_the_rooms_server_acl_drops_typing_and_receipts() -> None:
    """MSC4163 (as Synapse): typing and a room's receipts from a server the room's ACL
    refuses are dropped; the other rooms' receipts are kept."""
    recorder = Recorder()
    edus = handler(recorder)
    asked: list[tuple[str, str]] = []

    async def allowed(server: str, room_id: str) -> bool:
        asked.append((server, room_id))
        return room_id != "!banned:x"

    edus._server_allowed = allowed
    bob = f"@bob:{ORIGIN}"
    receipt = {bob: {"event_ids": ["$e"]}}

    async def scenario() -> None:
        await edus.on_edu(
            ORIGIN, "m.typing", {"room_id": "!banned:x", "user_id": bob, "typing": True}
        )
        await edus.on_edu(
            ORIGIN, "m.receipt", {"!banned:x": {"m.read": receipt}, "!ok:x": {"m.read": receipt}}
        )
        await edus.on_edu(ORIGIN, "m.typing", {"room_id": "!ok:x", "user_id": bob, "typing": True})

    asyncio.run(scenario())
    assert recorder.spoken_for == [bob, bob]  # the !ok:x receipt, the !ok:x typing
    assert ("remote.test", "!banned:x") in asked
