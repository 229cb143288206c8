"""The ``account_data`` section: the user's global account data (the response's
``account_data``) and per-room account data of joined rooms (merged into them by the
rooms section), from the ``account_data`` stream.

``m.push_rules``, as Synapse: every initial sync carries the user's push rules (the
server defaults for a user who never changed them, who has no stored copy); an
incremental one when they changed (their copy, written after each edit by
:mod:`roomstream.client.push_store`, is an ``account_data`` row)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self

from roomstream.client.filtering import EventFilter
from roomstream.client.push_store import PushRulesStore
from roomstream.client.pushrules import PUSH_RULES
from roomstream.client.sync_sections.base import (
    SyncContext,
    SyncServices,
    UserDataSection,
    events,
    user_key,
)
from roomstream.client.userdata import UserData
from roomstream.streams.rows import AccountDataRow

__all__ = ["AccountDataSection"]


class AccountDataSection(UserDataSection):
    name = "account_data"
    stream = "account_data"

    def __init__(self, userdata: UserData, push_rules: PushRulesStore | None = None) -> None:
        super().__init__(userdata)
        self.push_rules = push_rules

    @classmethod
    def from_services(cls, services: SyncServices) -> Self:
        return cls(services.userdata, services.push_rules)

    @staticmethod
    def wake_keys(row: Sequence[Any]) -> list[str]:
        return [user_key(str(AccountDataRow.from_wire(row).user_id))]

    async def collect(self, ctx: SyncContext, since: int | None, upto: int) -> int:
        since = 0 if ctx.initial or since is None else since
        # Read only when the stream moved past the token (or the defaults are due).
        initial_rules = ctx.initial and self.push_rules is not None
        if upto <= since and not initial_rules:
            return upto
        global_data: dict[str, dict[str, Any]] = {}
        room_data: dict[str, dict[str, dict[str, Any]]] = {}
        if upto > since:
            global_data, room_data = await self.userdata.account_data_since(
                ctx.user_id, since, upto
            )
        if initial_rules and PUSH_RULES not in global_data:
            assert self.push_rules is not None
            global_data[PUSH_RULES] = await self.push_rules.rules_of(ctx.user_id)
        only = ctx.filter
        account_events = _account_events(global_data, only.account_data)
        ctx.body["account_data"] = events(account_events)
        if account_events:
            ctx.has_news = True
        for room_id, by_type in room_data.items():
            # A room whose data the filter hides still has its (empty) entry.
            ctx.room_account_data[room_id] = _account_events(by_type, only.room_account_data)
        return upto


def _account_events(
    by_type: dict[str, dict[str, Any]], only: EventFilter | None = None
) -> list[dict[str, Any]]:
    events = [{"type": t, "content": c} for t, c in sorted(by_type.items())]
    return events if only is None or only.allows_all else only.apply(events)
