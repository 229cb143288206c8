"""Users' reports of events and rooms (``POST /rooms/{id}/report/{eventId}``, ``POST
/rooms/{id}/report``), stored for the server's admins (migration 0018).

Invariant: a report of an event is stored only when the reporter may see that event
(the read path's visibility records decide, as for ``GET /event``) and it is an event of
the room the path names; otherwise ``404 M_NOT_FOUND``, the same answer for an event that
does not exist and one the reporter may not see, so a report never reveals an event. A
room report needs only a room this server knows (Synapse's rule).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from roomstream.errors import NotFoundError
from roomstream.reading import RoomReader
from roomstream.rooms.store import EventStore
from roomstream.storage import Database, Transaction

__all__ = ["EventReport", "Reports", "RoomReport"]


@dataclass(frozen=True)
class EventReport:
    report_id: str
    received_ts: int
    room_id: str
    event_id: str
    user_id: str
    reason: str | None
    score: int | None


@dataclass(frozen=True)
class RoomReport:
    report_id: str
    received_ts: int
    room_id: str
    user_id: str
    reason: str


class Reports:
    """Stores reports; the one writer of ``event_reports`` and ``room_reports``."""

    def __init__(
        self,
        db: Database,
        reader: RoomReader,
        events: EventStore,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.db = db
        self.reader = reader
        self.events = events
        self._clock = clock

    async def report_event(
        self, user_id: str, room_id: str, event_id: str, reason: str | None, score: int | None
    ) -> str:
        """Store a report of an event the user may see (404 otherwise); its ID."""
        event = await self.reader.get_event(user_id, event_id)
        if event is None or event.get("room_id") != room_id:
            raise NotFoundError(
                "Unable to report event: it does not exist or you aren't able to see it."
            )
        report = EventReport(
            secrets.token_urlsafe(16),
            int(self._clock() * 1000),
            room_id,
            event_id,
            user_id,
            reason,
            score,
        )

        def txn(t: Transaction) -> None:
            t.execute(
                "INSERT INTO event_reports (report_id, received_ts, room_id, event_id,"
                " user_id, reason, score) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    report.report_id,
                    report.received_ts,
                    report.room_id,
                    report.event_id,
                    report.user_id,
                    report.reason,
                    report.score,
                ),
            )

        await self.db.run_interaction("report_event", txn)
        return report.report_id

    async def report_room(self, user_id: str, room_id: str, reason: str) -> str:
        """Store a report of a room this server knows (404 otherwise); its ID."""
        if await self.events.get_room_version(room_id) is None:
            raise NotFoundError("Room does not exist")
        report = RoomReport(
            secrets.token_urlsafe(16), int(self._clock() * 1000), room_id, user_id, reason
        )

        def txn(t: Transaction) -> None:
            t.execute(
                "INSERT INTO room_reports (report_id, received_ts, room_id, user_id, reason)"
                " VALUES (?, ?, ?, ?, ?)",
                (report.report_id, report.received_ts, room_id, user_id, reason),
            )

        await self.db.run_interaction("report_room", txn)
        return report.report_id

    async def event_reports(self, limit: int = 100) -> list[EventReport]:
        """The newest event reports first (for admins)."""
        rows = await self.db.run_interaction(
            "event_reports",
            lambda t: t.query(
                "SELECT report_id, received_ts, room_id, event_id, user_id, reason, score"
                " FROM event_reports ORDER BY received_ts DESC, report_id LIMIT ?",
                (limit,),
            ),
        )
        return [
            EventReport(
                str(r[0]),
                int(r[1]),
                str(r[2]),
                str(r[3]),
                str(r[4]),
                None if r[5] is None else str(r[5]),
                None if r[6] is None else int(r[6]),
            )
            for r in rows
        ]

    async def room_reports(self, limit: int = 100) -> list[RoomReport]:
        """The newest room reports first (for admins)."""
        rows = await self.db.run_interaction(
            "room_reports",
            lambda t: t.query(
                "SELECT report_id, received_ts, room_id, user_id, reason"
                " FROM room_reports ORDER BY received_ts DESC, report_id LIMIT ?",
                (limit,),
            ),
        )
        return [RoomReport(str(r[0]), int(r[1]), str(r[2]), str(r[3]), str(r[4])) for r in rows]
