"""The Client-Server API writes another process forwards to this one (the internal API's
``/client/...`` endpoints, :data:`roomstream.replication.endpoints.CLIENT_WRITES`),
carried out here exactly as for this process's own clients. The internal API has checked
that this process writes the stream; the forwarding process has authenticated the user
and checked membership."""

from __future__ import annotations

from typing import Any

from roomstream.accounts import Accounts, Keep, Requester
from roomstream.client.presence_service import PresenceWriter
from roomstream.client.push_store import PushRulesStore
from roomstream.client.pushers import PusherPool, parse_pusher
from roomstream.client.pushrules import PushRuleEdit
from roomstream.client.rooms import CreateRoomRequest, RoomService
from roomstream.client.typing import TypingWriter
from roomstream.client.userdata import UserData
from roomstream.e2e import E2eKeys
from roomstream.errors import ServiceUnavailableError
from roomstream.replication import endpoints as ep
from roomstream.replication.endpoints import BoundEndpoint

__all__ = ["ForwardedWrites"]

#: The device of a forwarded createRoom's requester (room creation does not use it).
FORWARDED_DEVICE = ""


class ForwardedWrites:
    """The handler of each forwarded write (:meth:`bindings`, served by the internal
    API's server)."""

    def __init__(
        self,
        accounts: Accounts,
        rooms: RoomService,
        data: UserData,
        typing: TypingWriter | None,
        keys: E2eKeys | None = None,
        presence: PresenceWriter | None = None,
        pushers: PusherPool | None = None,
        push_rules: PushRulesStore | None = None,
    ) -> None:
        self.pushers = pushers
        self.push_rules = push_rules
        self.keys = keys
        self.presence = presence
        self.accounts = accounts
        self.rooms = rooms
        self.data = data
        self.typing = typing

    def bindings(self) -> list[BoundEndpoint[Any, Any]]:
        """Every endpoint of :data:`~roomstream.replication.endpoints.CLIENT_WRITES`,
        bound to its handler here."""
        return [
            ep.CREATE_ROOM.bind(self.create_room),
            ep.SEND.bind(self.send_once),
            ep.END_SESSIONS.bind(self.end_sessions),
            ep.ACCOUNT_DATA.bind(self.put_account_data),
            ep.RECEIPT.bind(self.put_receipt),
            ep.TO_DEVICE.bind(self.send_to_device),
            ep.TYPING.bind(self.set_typing),
            ep.E2E_KEYS.bind(self.e2e_keys),
            ep.PRESENCE.bind(self.set_presence),
            ep.PUSHER.bind(self.set_pusher),
            ep.PUSH_RULE_EDIT.bind(self.edit_push_rules),
            ep.DEVICE_PUSHERS.bind(self.remove_device_pushers),
        ]

    async def edit_push_rules(self, call: ep.PushRuleEditCall) -> None:
        if self.push_rules is None:
            raise ServiceUnavailableError("push rules are not written here", retry_after_ms=1000)
        change = PushRuleEdit(call.op, call.kind, call.rule_id, call.body, call.before, call.after)
        await self.push_rules.edit(call.user_id, change)

    async def set_pusher(self, call: ep.PusherCall) -> None:
        if self.pushers is None:
            raise ServiceUnavailableError("pushers are not served here", retry_after_ms=1000)
        pusher, append = parse_pusher(call.user_id, call.body, call.device_id)
        await self.pushers.set(pusher, append, call.user_id)

    async def remove_device_pushers(self, call: ep.DevicePushersCall) -> None:
        if self.pushers is None:
            raise ServiceUnavailableError("pushers are not served here", retry_after_ms=1000)
        await self.pushers.remove_for_devices(call.user_id, [call.device_id])

    async def create_room(self, call: ep.CreateRoomCall) -> str:
        requester = Requester(call.creator, FORWARDED_DEVICE)
        return await self.rooms.create_room(requester, CreateRoomRequest.parse(call.request))

    async def send_once(self, call: ep.SendCall) -> str:
        requester = Requester(call.user_id, call.device_id)
        return await self.rooms.send_once(
            requester, call.room_id, call.txn_id, call.type, call.content, call.redacts
        )

    async def end_sessions(self, call: ep.EndSessionsCall) -> None:
        keep = None if call.keep_device is None else Keep(call.keep_device, call.keep_token)
        await self.accounts.end_sessions(call.user_id, call.device_id, keep)

    async def put_account_data(self, call: ep.AccountDataCall) -> None:
        await self.data.put_account_data(call.user_id, call.room_id, call.type, call.content)

    async def put_receipt(self, call: ep.ReceiptCall) -> None:
        await self.data.put_receipt(
            call.room_id, call.receipt_type, call.user_id, call.event_id, call.thread_id, call.ts
        )

    async def send_to_device(self, call: ep.ToDeviceCall) -> None:
        await self.data.send_to_device(call.sender, call.type, call.messages, call.transaction)

    async def set_typing(self, call: ep.TypingCall) -> None:
        if self.typing is None:
            raise ServiceUnavailableError("this process has no typing writer running")
        self.typing.set_typing(call.room_id, call.user_id, call.typing, call.timeout)

    async def e2e_keys(self, call: ep.E2eKeysCall) -> Any:
        if self.keys is None:
            raise ServiceUnavailableError("this process serves no end-to-end keys")
        return await self.keys.perform(call.op, call.args)

    async def set_presence(self, call: ep.PresenceCall) -> None:
        if self.presence is None:
            raise ServiceUnavailableError("this process does not write presence")
        await self.presence.set_state(
            call.user_id, call.device_id, call.presence, call.status_msg, is_sync=call.is_sync
        )
