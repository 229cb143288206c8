"""Where the Client-Server API's writes happen: on this process or on the one that writes
their stream, forwarded over the internal HTTP API. The one place that decides.

- Events: a room's events are persisted by one ``events`` writer (:mod:`roomstream.
  replication.sharding`). :class:`RoomWriter` creates the event here when this process
  owns the room and hands it to the owner otherwise (with a top-level ``redacts``, which
  the owner's builder places as the room version says). A whole ``createRoom`` request is
  carried out by this process when it writes events, else forwarded to the first
  configured events writer, which creates the room exactly as for its own clients.
- Per-user data (:class:`UserDataWriter`): account data (global, per room, tags), read
  receipts and to-device messages are written here when this process writes their
  stream, else by the stream's writer the key hashes to (the user for account data and
  to-device, the room for receipts); typing always by the typing writer the room hashes
  to (each room's list lives in one writer's memory).

A writer that cannot be reached answers 503 ``M_UNAVAILABLE`` with ``retry_after_ms``;
errors it answers (403, 400, ...) pass through with their status and errcode.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import aiohttp

from roomstream.client.typing import TypingWriter
from roomstream.client.userdata import ToDeviceTransaction, UserData
from roomstream.config import Config
from roomstream.errors import MatrixError, ServiceUnavailableError
from roomstream.events.room_versions import RoomVersion
from roomstream.replication import endpoints as ep
from roomstream.replication.http import RETRY_AFTER_MS, InternalHttpClient
from roomstream.replication.sharding import writer_for_room
from roomstream.rooms.creation import LocalEventCreator, RoomPreset
from roomstream.rooms.persist import TransactionKey

__all__ = ["RoomWriter", "UserDataWriter", "forwarded_call"]

T = TypeVar("T")


async def forwarded_call(instance: str, call: Awaitable[T]) -> T:
    """Await a call to ``instance``; any failure to reach it is a 503 (the internal client
    already maps refused and timed-out connections; this catches the rest, and an
    instance with no ``internal_port`` configured)."""
    try:
        return await call
    except MatrixError:
        raise  # the writer's own answer (some are LookupErrors too)
    except (aiohttp.ClientError, OSError, TimeoutError, LookupError) as exc:
        raise ServiceUnavailableError(
            f"{instance} is unreachable ({exc})", retry_after_ms=RETRY_AFTER_MS
        ) from None


class RoomWriter:
    def __init__(
        self,
        config: Config,
        creator: LocalEventCreator,
        http_client: InternalHttpClient | None,
    ) -> None:
        self.config = config
        self.creator = creator
        self.http_client = http_client
        self.is_events_writer = config.instance_name in config.writers_of("events")
        self._last_create_ms = 0

    def _owner(self, room_id: str) -> str:
        return writer_for_room(room_id, self.config.writers_of("events"))

    def writes_room(self, room_id: str) -> bool:
        """Events of ``room_id`` are created on this process (else forwarded)."""
        return self.http_client is None or self._owner(room_id) == self.config.instance_name

    @property
    def creates_rooms_here(self) -> bool:
        """New rooms are created by this process (else :meth:`forward_create_room`)."""
        return self.is_events_writer or self.http_client is None

    async def send(
        self,
        room_id: str,
        sender: str,
        event_type: str,
        content: Mapping[str, Any],
        *,
        state_key: str | None = None,
        redacts: str | None = None,
        transaction: TransactionKey | None = None,
    ) -> str:
        """Create, authorize and persist one event; its event ID.

        Auth failures surface as ``AuthError`` (403 M_FORBIDDEN), from here or the owner.
        ``transaction`` (only where :meth:`writes_room`): recorded with the event.
        """
        owner = self._owner(room_id)
        if owner == self.config.instance_name or self.http_client is None:
            created = await self.creator.create_event(
                room_id,
                sender,
                event_type,
                content,
                state_key=state_key,
                redacts=redacts,
                transaction=transaction,
            )
            return created.event.event_id
        assert transaction is None, "idempotent sends go to the owner whole (forward_send_once)"
        call = ep.SendEventCall(room_id, sender, event_type, dict(content), state_key, redacts)
        result = await forwarded_call(owner, self.http_client.call(ep.SEND_EVENT, owner, call))
        return str(result["event_id"])

    async def forward_send_once(
        self,
        room_id: str,
        transaction: TransactionKey,
        event_type: str,
        content: Mapping[str, Any],
        redacts: str | None,
    ) -> str:
        """Have the room's owner carry out a whole idempotent send (``PUT /send``)."""
        assert self.http_client is not None
        owner = self._owner(room_id)
        user_id, device_id, txn_id = transaction
        return await forwarded_call(
            owner,
            self.http_client.call(
                ep.SEND,
                owner,
                ep.SendCall(
                    room_id, user_id, device_id, txn_id, event_type, dict(content), redacts
                ),
            ),
        )

    async def create_room(
        self,
        creator: str,
        version: RoomVersion,
        preset: RoomPreset,
        creation_content: Mapping[str, Any] | None = None,
    ) -> str:
        """A new room, created here (:attr:`creates_rooms_here`), with the creator joined,
        default power levels, the preset's join rule and ``shared`` history; the caller
        sends the rest of the initial state. ``creation_content``: extra keys of the
        create event's content."""
        # A version-12 room ID is the hash of its create event: two rooms created by one
        # user in the same millisecond would be one room. Creation times from this
        # process are made distinct.
        now_ms = max(int(time.time() * 1000), self._last_create_ms + 1)
        self._last_create_ms = now_ms
        room_id, _ = await self.creator.create_room(
            creator,
            version=version,
            preset=preset,
            origin_server_ts=now_ms,
            creation_content=creation_content,
        )
        return room_id

    async def forward_create_room(self, creator: str, request: dict[str, Any]) -> str:
        """Have the first events writer carry out a whole ``createRoom`` request body."""
        assert self.http_client is not None
        first = self.config.writers_of("events")[0]
        return await forwarded_call(
            first, self.http_client.call(ep.CREATE_ROOM, first, ep.CreateRoomCall(creator, request))
        )


class UserDataWriter:
    """Account data, receipts, to-device messages and typing, written on the process that
    writes their stream (see the module docstring)."""

    def __init__(
        self,
        config: Config,
        data: UserData,
        typing: TypingWriter | None,
        http_client: InternalHttpClient | None,
    ) -> None:
        self.config = config
        self.data = data
        self.typing = typing
        self.http_client = http_client
        #: Called with (user, room or None, type) once an account-data write returned
        #: (or failed: it may have happened), here or on the writer: caches of this
        #: process that derive from account data forget the user's entry.
        self.account_data_written: list[Callable[[str, str | None, str], object]] = []

    def _remote_writer(self, stream_name: str, key: str) -> str | None:
        """The writer to forward to; None: write here (this process writes the stream, or
        has nobody to forward to, and then :class:`UserData` refuses if it may not)."""
        writers = self.config.writers_of(stream_name)
        if self.config.instance_name in writers or self.http_client is None:
            return None
        return writer_for_room(key, writers)

    async def put_account_data(
        self, user_id: str, room_id: str | None, data_type: str, content: Mapping[str, Any]
    ) -> None:
        try:
            remote = self._remote_writer("account_data", user_id)
            if remote is None:
                await self.data.put_account_data(user_id, room_id, data_type, content)
                return
            assert self.http_client is not None
            await forwarded_call(
                remote,
                self.http_client.call(
                    ep.ACCOUNT_DATA,
                    remote,
                    ep.AccountDataCall(user_id, room_id, data_type, dict(content)),
                ),
            )
        finally:
            for listener in self.account_data_written:
                listener(user_id, room_id, data_type)

    async def put_receipt(
        self,
        room_id: str,
        receipt_type: str,
        user_id: str,
        event_id: str,
        thread_id: str | None,
        ts: int | None = None,
    ) -> None:
        """``ts``: when the receipt was made, if not now (another server's receipt)."""
        remote = self._remote_writer("receipts", room_id)
        if remote is None:
            await self.data.put_receipt(room_id, receipt_type, user_id, event_id, thread_id, ts)
            return
        assert self.http_client is not None
        await forwarded_call(
            remote,
            self.http_client.call(
                ep.RECEIPT,
                remote,
                ep.ReceiptCall(room_id, receipt_type, user_id, event_id, thread_id, ts),
            ),
        )

    async def send_to_device(
        self,
        sender: str,
        event_type: str,
        messages: Mapping[str, Mapping[str, Any]],
        transaction: ToDeviceTransaction | None = None,
    ) -> None:
        """Queue the messages once per ``transaction`` (sending device, transaction ID):
        recorded by the writer with the messages (:meth:`UserData.send_to_device`)."""
        remote = self._remote_writer("to_device", sender)
        if remote is None:
            await self.data.send_to_device(sender, event_type, messages, transaction)
            return
        assert self.http_client is not None
        plain = {user: {device: dict(c) for device, c in m.items()} for user, m in messages.items()}
        await forwarded_call(
            remote,
            self.http_client.call(
                ep.TO_DEVICE,
                remote,
                ep.ToDeviceCall(sender, event_type, plain, *(transaction or (None, None))),
            ),
        )

    async def set_typing(self, room_id: str, user_id: str, typing: bool, timeout_ms: int) -> None:
        writers = self.config.writers_of("typing")
        owner = writer_for_room(room_id, writers)
        if owner == self.config.instance_name or self.http_client is None:
            if self.typing is None:
                raise ServiceUnavailableError(
                    f"{self.config.instance_name} has no typing writer running"
                )
            self.typing.set_typing(room_id, user_id, typing, timeout_ms)
            return
        await forwarded_call(
            owner,
            self.http_client.call(
                ep.TYPING, owner, ep.TypingCall(room_id, user_id, typing, timeout_ms)
            ),
        )
