"""A small community, written in steps by two writers, for the views tests: public and
private rooms, invites, joins, renames, a ban, a state reset, a state removal, messages on
several days, an outlier and a rejected event."""

from __future__ import annotations

from roomstream.storage import Database
from roomstream.streams import StreamIdGenerator
from tests.support.pipelines import (
    BASE_TS,
    DAY_MS,
    Ev,
    event_id_for,
    events_generator,
    member,
    message,
    write_events,
)

PUB, PRIV, SOLO = "!pub:x", "!priv:x", "!solo:x"


def join_rules(room: str, rule: str, sender: str) -> Ev:
    return Ev(room, "m.room.join_rules", sender, state_key="", content={"join_rule": rule})


class Scenario:
    """Call :meth:`step` for i in range(STEPS); each writes one batch of facts."""

    STEPS = 3

    def __init__(self, db: Database) -> None:
        self.db = db
        self.gens: dict[str, StreamIdGenerator] = {}
        self.carol_invite: str | None = None

    async def setup(self) -> None:
        for w in ("a", "b"):
            self.gens[w] = await events_generator(self.db, w, ["a", "b"])

    async def _write(self, writer: str, evs: list[Ev]) -> list[int]:
        return await write_events(self.db, self.gens[writer], evs)

    async def step(self, i: int) -> None:
        d0, d1, d2 = BASE_TS, BASE_TS + DAY_MS, BASE_TS + 2 * DAY_MS
        if i == 0:
            await self._write(
                "a",
                [
                    join_rules(PUB, "public", "@alice"),
                    member(PUB, "@alice", "join", name="Alice"),
                    message(PUB, "@alice", d0),
                    message(PUB, "@alice", d0 + 5),
                    message(PUB, "@alice", d1),
                ],
            )
            ids = await self._write(
                "b",
                [
                    member(PRIV, "@bob", "join", name="Bob"),
                    member(PRIV, "@carol", "invite", sender="@bob"),
                    message(PRIV, "@bob", d1),
                    member(SOLO, "@dave", "join", name="Dave"),
                    Ev(PRIV, "m.room.message", "@eve", outlier=True),
                    Ev(PRIV, "m.room.message", "@eve", rejected=True),
                    Ev(SOLO, "m.room.topic", "@dave", state_key="", content={"topic": "t"}),
                ],
            )
            self.carol_invite = event_id_for(ids[1], "b")
        elif i == 1:
            await self._write(
                "a",
                [
                    member(PRIV, "@carol", "join", name="Carol"),
                    member(PRIV, "@bob", "join", name="Bobby"),
                    member(PRIV, "@alice", "join", name="Alice in priv"),
                    member(PUB, "@mallory", "join", name="Mal"),
                ],
            )
            await self._write(
                "b",
                [
                    member(PUB, "@mallory", "ban", sender="@alice"),
                    message(PRIV, "@carol", d2),
                    message(PRIV, "@bob", d2),
                ],
            )
        else:
            assert self.carol_invite is not None
            await self._write(
                "a",
                [
                    # a state reset to an event persisted two batches ago
                    Ev(PRIV, "m.room.member", "@carol", state_key="@carol", delta_only=True,
                       delta_event=self.carol_invite),
                    # topic removed from current state
                    Ev(SOLO, "m.room.topic", "@dave", state_key="", delta_only=True),
                    join_rules(PRIV, "public", "@bob"),
                    member(PRIV, "@bob", "leave"),
                    message(SOLO, "@dave", d2 + 1),
                ],
            )  # fmt: skip
            await self._write("b", [member(PUB, "@zed", "join", name="Zed")])
        await self.sync()

    async def sync(self) -> None:
        """Each writer hears the others' positions (as replication would tell it) and stores
        its own, so the linear position reaches the last fact written."""
        for gen in self.gens.values():
            for other, other_gen in self.gens.items():
                if other_gen is not gen:
                    gen.advance(other, other_gen.get_position(other))
            await gen.store_local_position()
