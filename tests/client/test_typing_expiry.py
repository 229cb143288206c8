"""Typing notifications expire when their timeout passes without a renewal.

:class:`TypingWriter` with a fake clock and timers (time is driven, not slept through),
against a naive oracle in a property test; and over HTTP on both engines, a syncing
client's long poll is woken by the expiry (a 200 ms timeout; no sleep in the test)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from roomstream.client.typing import MAX_TYPING_TIMEOUT_MS, TypingState, TypingWriter
from tests.support.client import room_with
from tests.support.homeserver import Homeserver


@dataclass
class _Timer:
    due: float
    callback: Callable[[], None]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class FakeTime:
    """A clock and ``call_later`` driven by :meth:`advance`, which fires due timers in
    order of their due time, each at its due time (as the event loop would)."""

    now: float = 1000.0
    timers: list[_Timer] = field(default_factory=list)

    def clock(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Callable[[], None]) -> _Timer:
        timer = _Timer(self.now + max(0.0, delay), callback)
        self.timers.append(timer)
        return timer

    def pending(self) -> list[_Timer]:
        return [t for t in self.timers if not t.cancelled]

    def advance(self, seconds: float) -> None:
        end = self.now + seconds
        while True:
            due = [t for t in self.pending() if t.due <= end]
            if not due:
                break
            timer = min(due, key=lambda t: t.due)
            self.timers.remove(timer)
            self.now = max(self.now, timer.due)
            timer.callback()
        self.now = end


def _writer(fake: FakeTime) -> tuple[TypingWriter, list[tuple[str, list[str]]]]:
    rows: list[tuple[str, list[str]]] = []

    def append(new: list[tuple[str, list[str]]]) -> int:
        rows.extend(new)
        return len(rows)

    writer = TypingWriter(TypingState(), append, fake.clock, fake.call_later)
    return writer, rows


def test_typing_ends_when_the_timeout_passes() -> None:
    fake = FakeTime()
    writer, rows = _writer(fake)
    writer.set_typing("!r", "@a:x", True, 5000)
    assert rows == [("!r", ["@a:x"])]
    assert len(fake.pending()) == 1  # one timer, at the expiry
    fake.advance(4.999)
    assert writer.state.changed(["!r"], 0) == {"!r": ["@a:x"]}
    fake.advance(0.001)
    assert rows[-1] == ("!r", [])
    assert writer.state.changed(["!r"], 1) == {"!r": []}
    assert fake.pending() == []  # nobody typing: no timer


def test_a_renewal_moves_the_expiry_and_stopping_cancels_it() -> None:
    fake = FakeTime()
    writer, rows = _writer(fake)
    writer.set_typing("!r", "@a:x", True, 1000)
    fake.advance(0.8)
    writer.set_typing("!r", "@a:x", True, 1000)  # renewed: no new row
    assert rows == [("!r", ["@a:x"])]
    fake.advance(0.9)
    assert writer.state.changed(["!r"], 0) == {"!r": ["@a:x"]}
    fake.advance(0.1)
    assert rows[-1] == ("!r", [])
    writer.set_typing("!r", "@b:x", True, 1000)
    writer.set_typing("!r", "@b:x", False, 0)
    assert rows[-1] == ("!r", []) and fake.pending() == []
    # Longer timeouts are capped.
    writer.set_typing("!r", "@c:x", True, 10**9)
    fake.advance(MAX_TYPING_TIMEOUT_MS / 1000)
    assert rows[-1] == ("!r", [])


def test_a_failing_publish_does_not_stop_later_expiries() -> None:
    fake = FakeTime()
    rows: list[tuple[str, list[str]]] = []
    fail = [False]

    def append(new: list[tuple[str, list[str]]]) -> int:
        if fail[0]:
            fail[0] = False
            raise RuntimeError("announce failed")
        rows.extend(new)
        return len(rows)

    writer = TypingWriter(TypingState(), append, fake.clock, fake.call_later)
    writer.set_typing("!a", "@a:x", True, 1000)
    writer.set_typing("!b", "@b:x", True, 2000)
    fail[0] = True
    with contextlib.suppress(RuntimeError):
        fake.advance(1)
    fake.advance(1)
    assert rows[-1] == ("!b", [])


_OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("set"),
            st.sampled_from(["!r1", "!r2"]),
            st.sampled_from(["@a:x", "@b:x", "@c:x"]),
            st.booleans(),
            st.integers(0, 5000),
        ),
        st.tuples(st.just("advance"), st.integers(0, 3000)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(_OPS)
def test_who_is_typing_matches_a_naive_oracle(ops: list[tuple[object, ...]]) -> None:
    """After every step the published list of each room is exactly the users whose
    last ``typing: true`` (not followed by ``false``) has not timed out yet."""
    fake = FakeTime()
    writer, _ = _writer(fake)
    expiry: dict[tuple[str, str], float] = {}
    for op in ops:
        if op[0] == "set":
            _, room, user, typing, timeout = op
            assert isinstance(room, str) and isinstance(user, str)
            assert isinstance(timeout, int)
            if typing:
                expiry[(room, user)] = fake.now + timeout / 1000
            else:
                expiry.pop((room, user), None)
            writer.set_typing(room, user, bool(typing), timeout)
        else:
            assert isinstance(op[1], int)
            fake.advance(op[1] / 1000)
        for room in ("!r1", "!r2"):
            expected = sorted(u for (r, u), e in expiry.items() if r == room and e > fake.now)
            published = writer.state.changed([room], -1).get(room, [])
            assert published == expected, (room, fake.now)


async def test_a_syncing_client_sees_typing_expire(homeserver: Homeserver) -> None:
    """Over HTTP: Bob's long poll (30 s) is woken when Alice's 200 ms typing expires,
    and says she is no longer typing. A poll that timed out instead would return
    nothing for the room."""
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    room_id = await room_with(hs, alice, bob)
    start = await hs.ok("GET", "/sync?timeout=0", token=bob.token)
    await hs.ok(
        "PUT",
        f"/rooms/{room_id}/typing/{alice.user_id}",
        {"typing": True, "timeout": 200},
        token=alice.token,
    )
    typing = await hs.ok("GET", f"/sync?timeout=30000&since={start['next_batch']}", token=bob.token)

    # The long poll returns for the first change (Alice typing), or for the expiry if
    # it came first; either way the expiry is what the client ends up with.
    def users(body: dict[str, object]) -> list[list[str]]:
        room = body["rooms"]["join"].get(room_id, {})  # type: ignore[index]
        events = room.get("ephemeral", {}).get("events", [])
        return [e["content"]["user_ids"] for e in events if e["type"] == "m.typing"]

    seen = users(typing)
    assert seen in ([[alice.user_id]], [[]])
    if seen == [[alice.user_id]]:
        typing = await hs.ok(
            "GET", f"/sync?timeout=30000&since={typing['next_batch']}", token=bob.token
        )
        assert users(typing) == [[]]
    # Alice's own sync says the same.
    mine = await hs.ok("GET", "/sync?timeout=0", token=alice.token)
    assert users(mine) in ([], [[]])
