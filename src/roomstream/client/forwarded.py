"""The Client-Server API writes another process forwards to this one (the internal API's
``/client/...`` routes, :class:`roomstream.replication.http.ClientWrites`), carried out
here exactly as for this process's own clients. The internal API has checked that this
process writes the stream; the forwarding process has authenticated the user and checked
membership."""

from __future__ import annotations

from typing import Any

from roomstream.accounts import Accounts, Requester
from roomstream.client.rooms import CreateRoomRequest, RoomService
from roomstream.client.typing import TypingWriter
from roomstream.client.userdata import ToDeviceTransaction, UserData
from roomstream.e2e import E2eKeys
from roomstream.errors import ServiceUnavailableError

__all__ = ["ForwardedWrites"]

#: The device of a forwarded createRoom's requester (room creation does not use it).
FORWARDED_DEVICE = ""


class ForwardedWrites:
    def __init__(
        self,
        accounts: Accounts,
        rooms: RoomService,
        data: UserData,
        typing: TypingWriter | None,
        keys: E2eKeys | None = None,
    ) -> None:
        self.keys = keys
        self.accounts = accounts
        self.rooms = rooms
        self.data = data
        self.typing = typing

    async def create_room(self, creator: str, request: dict[str, Any]) -> str:
        requester = Requester(creator, FORWARDED_DEVICE)
        return await self.rooms.create_room(requester, CreateRoomRequest.parse(request))

    async def send_once(
        self,
        room_id: str,
        user_id: str,
        device_id: str,
        txn_id: str,
        event_type: str,
        content: dict[str, Any],
        redacts: str | None,
    ) -> str:
        return await self.rooms.send_once(
            Requester(user_id, device_id), room_id, txn_id, event_type, content, redacts
        )

    async def end_sessions(self, user_id: str, device_id: str | None) -> None:
        await self.accounts.end_sessions(user_id, device_id)

    async def put_account_data(
        self, user_id: str, room_id: str | None, data_type: str, content: dict[str, Any]
    ) -> None:
        await self.data.put_account_data(user_id, room_id, data_type, content)

    async def put_receipt(
        self, room_id: str, receipt_type: str, user_id: str, event_id: str, thread_id: str | None
    ) -> None:
        await self.data.put_receipt(room_id, receipt_type, user_id, event_id, thread_id)

    async def send_to_device(
        self,
        sender: str,
        event_type: str,
        messages: dict[str, dict[str, Any]],
        transaction: ToDeviceTransaction | None = None,
    ) -> None:
        await self.data.send_to_device(sender, event_type, messages, transaction)

    async def set_typing(self, room_id: str, user_id: str, typing: bool, timeout_ms: int) -> None:
        if self.typing is None:
            raise ServiceUnavailableError("this process has no typing writer running")
        self.typing.set_typing(room_id, user_id, typing, timeout_ms)

    async def e2e_keys(self, op: str, args: dict[str, Any]) -> Any:
        if self.keys is None:
            raise ServiceUnavailableError("this process serves no end-to-end keys")
        return await self.keys.perform(op, args)
