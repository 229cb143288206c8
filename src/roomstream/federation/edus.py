"""Inbound EDUs: what the ``edus`` of another server's ``PUT /send/{txnId}`` do here.

:class:`FederationEdus` is the ``EduHandler`` the ``/send`` handler calls once per EDU
(``on_edu(origin, edu_type, content)``, ``origin`` authenticated by the transport). Each
EDU reaches the service a local client's action would (so ``/sync`` shows it through the
streams it already reads):

- ``m.typing``: the remote user types (for Synapse's ``FEDERATION_TIMEOUT``, 60 s,
  unless they stop first) in the ``typing`` stream, as a local user would;
- ``m.receipt``: the remote users' receipts (threaded too) in the ``receipts`` stream,
  with the time their server gave (``data.ts``);
- ``m.presence``: the remote users' presence in the ``presence`` stream (shown to local
  users sharing a room with them, as local presence is);
- ``m.device_list_update`` / ``m.signing_key_update``: the remote user's cached devices
  (:mod:`~roomstream.federation.remote_devices`) and a ``device_lists`` row, so local
  sharers' ``device_lists.changed`` names them;
- ``m.direct_to_device``: the messages queued for local users' devices (the to-device
  path, ``*`` for every device), once per (sender, ``message_id``): a transaction sent
  again delivers nothing twice.

Invariants (Synapse's checks):

- every user an EDU speaks for (the typer, a receipt's reader, a presence's user, a
  device list's owner, a to-device sender) belongs to ``origin``; others are dropped
  and logged (one server cannot speak for another's users);
- typing and receipts are taken only for rooms both ``origin`` and this server are in
  (a joined user there, :mod:`~roomstream.federation.membership`) and whose server ACL
  (``m.room.server_acl``, when a check is given) lets ``origin`` in (MSC4163);
- to-device messages are queued only for users of this server;
- :meth:`FederationEdus.on_edu` never raises: invalid content, an unknown EDU type or a
  failing service are logged and the EDU is dropped, and the transaction still
  succeeds (Synapse too drops invalid content, but fails the transaction when a
  service fails, so that to-device messages are retried: not done here).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from roomstream.client import ClientProcess
from roomstream.client.presence import OFFLINE, ONLINE, UNAVAILABLE, UserPresence
from roomstream.federation.membership import RoomServers, server_of
from roomstream.federation.remote_devices import DeviceListUpdate, RemoteDeviceLists
from roomstream.rooms.engine import RoomEngine
from roomstream.storage import Database, Transaction

__all__ = [
    "FEDERATION_TYPING_TIMEOUT_MS",
    "DeviceListsSink",
    "EduHandler",
    "FederationEdus",
    "HostsInRooms",
    "InvalidEdu",
    "ServerAllowed",
]

logger = logging.getLogger(__name__)

#: How long a remote user shows as typing unless their server says again (Synapse's
#: ``FEDERATION_TIMEOUT``; servers resend every 40 s while the user types).
FEDERATION_TYPING_TIMEOUT_MS = 60_000
#: Longest ID, type or key accepted from an EDU (longer ones are dropped).
MAX_ID_LENGTH = 255
#: Most event IDs one receipt may name (their latest stored is the receipt's).
MAX_RECEIPT_EVENTS = 100
#: The device ID to-device transactions from other servers are recorded under (with the
#: sender and the EDU's ``message_id``); no client device can have it (it has a space).
FEDERATION_TO_DEVICE = "federation message"

PRESENCE_STATES = (ONLINE, UNAVAILABLE, OFFLINE)


class EduHandler(Protocol):
    """What the inbound ``/send`` handler calls for each EDU of a transaction."""

    async def on_edu(self, origin: str, edu_type: str, content: Mapping[str, Any]) -> None: ...


class HostsInRooms(Protocol):
    """Which servers are in which rooms (:class:`~roomstream.federation.membership.RoomServers`)."""

    async def is_host_in_room(self, room_id: str, server_name: str) -> bool: ...


class DeviceListsSink(Protocol):
    """Where device list and cross-signing updates go
    (:class:`~roomstream.federation.remote_devices.RemoteDeviceLists`)."""

    async def apply_update(self, update: DeviceListUpdate) -> bool: ...

    async def apply_signing_keys(self, user_id: str, keys: Mapping[str, Any]) -> bool: ...


class InvalidEdu(ValueError):
    """An EDU (or part of one) not shaped as the spec says; dropped with a log line."""


#: (room, user, typing, timeout ms): the typing stream's writer (or the forward to it).
SetTyping = Callable[[str, str, bool, int], Awaitable[None]]
#: (room, receipt type, user, event, thread or None, when made (ms) or None: now).
PutReceipt = Callable[[str, str, str, str, "str | None", "int | None"], Awaitable[object]]
#: (sender, event type, user -> device -> content, (device, transaction ID)).
SendToDevice = Callable[
    [str, str, Mapping[str, Mapping[str, Any]], "tuple[str, str] | None"], Awaitable[object]
]
#: Whether a room's ``m.room.server_acl`` lets a server in: (server name, room).
ServerAllowed = Callable[[str, str], Awaitable[bool]]
#: Stores remote users' presence states (the ``presence`` stream's writer).
PutPresence = Callable[[Sequence[UserPresence]], Awaitable[object]]


def _string(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_ID_LENGTH:
        raise InvalidEdu(f"{what} must be a non-empty string of at most {MAX_ID_LENGTH}")
    return value


def _mapping(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidEdu(f"{what} must be an object")
    return value


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise InvalidEdu(f"{what} must be a non-negative integer")
    return value


def _latest_stored_txn(t: Transaction, room_id: str, event_ids: Sequence[str]) -> str | None:
    marks = ", ".join("?" for _ in event_ids)
    row = t.query_one(
        f"SELECT event_id FROM events WHERE room_id = ? AND event_id IN ({marks})"
        " ORDER BY stream_ordering DESC LIMIT 1",
        (room_id, *event_ids),
    )
    return None if row is None else str(row[0])


class FederationEdus:
    """The inbound EDU handler (see the module docstring). The services are passed in as
    callables (the client layer's ``UserDataWriter`` methods in a homeserver) so that
    tests can watch them and the assembly can route each to its stream's writer.
    ``put_presence`` None: presence is off here (``m.presence`` EDUs are dropped)."""

    def __init__(
        self,
        server_name: str,
        db: Database,
        *,
        set_typing: SetTyping,
        put_receipt: PutReceipt,
        send_to_device: SendToDevice,
        put_presence: PutPresence | None,
        device_lists: DeviceListsSink,
        rooms: HostsInRooms | None = None,
        server_allowed: ServerAllowed | None = None,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        """``rooms``: who is in which room (default: this database's current state).
        ``server_allowed``: the rooms' server ACLs (the transport's ``m.room.server_acl``
        check; None: no ACL is applied to EDUs)."""
        self.server_name = server_name
        self.db = db
        self.rooms: HostsInRooms = rooms if rooms is not None else RoomServers(db)
        self._server_allowed = server_allowed
        self._set_typing = set_typing
        self._put_receipt = put_receipt
        self._send_to_device = send_to_device
        self._put_presence = put_presence
        self.device_lists = device_lists
        self._clock = clock_ms
        self._handlers: dict[str, Callable[[str, Mapping[str, Any]], Awaitable[None]]] = {
            "m.typing": self._typing,
            "m.receipt": self._receipts,
            "m.presence": self._presence,
            "m.device_list_update": self._device_list_update,
            "m.signing_key_update": self._signing_key_update,
            "m.direct_to_device": self._direct_to_device,
        }

    @classmethod
    def for_client_process(
        cls,
        process: ClientProcess,
        engine: RoomEngine,
        server_allowed: ServerAllowed | None = None,
    ) -> FederationEdus:
        """The handler of a homeserver process: typing, receipts and to-device through
        its ``UserDataWriter`` (on this process or forwarded to each stream's writer),
        presence stored when this process writes the ``presence`` stream and presence is
        enabled (elsewhere dropped: no forward for remote presence yet), device lists in
        its database with the ``device_lists`` row when it writes that stream."""
        writer = process.user_data_writer
        presence = process.presence
        put_presence: PutPresence | None = None
        if presence.enabled and presence.writer is not None:
            put_presence = presence.store.persist
        keys = process.keys
        return cls(
            process.config.server_name,
            engine.db,
            set_typing=writer.set_typing,
            put_receipt=writer.put_receipt,
            send_to_device=writer.send_to_device,
            put_presence=put_presence,
            device_lists=RemoteDeviceLists(
                engine.db,
                engine.streams.generator("device_lists"),
                on_changed=keys.cache.invalidate_users,
            ),
            server_allowed=server_allowed,
        )

    async def on_edu(self, origin: str, edu_type: str, content: Mapping[str, Any]) -> None:
        """Handle one EDU from ``origin``; never raises (see the module docstring)."""
        handler = self._handlers.get(edu_type) if isinstance(edu_type, str) else None
        if handler is None:
            logger.debug("EDU of unknown type %r from %s ignored", str(edu_type)[:80], origin)
            return
        try:
            await handler(origin, _mapping(content, f"{edu_type} content"))
        except InvalidEdu as exc:
            logger.info("%s EDU from %s dropped: %s", edu_type, origin, exc)
        except Exception:
            logger.exception("%s EDU from %s failed and was dropped", edu_type, origin)

    async def _shared_room(self, origin: str, room_id: str, edu_type: str) -> bool:
        """Whether both ``origin`` and this server are in the room and the room's server
        ACL lets ``origin`` in (logged when not): Synapse ignores typing and receipts
        otherwise (the ACL per MSC4163)."""
        if self._server_allowed is not None and not await self._server_allowed(origin, room_id):
            logger.info(
                "%s from %s for %.80s: refused by the room's server ACL", edu_type, origin, room_id
            )
            return False
        for server in (self.server_name, origin):
            if not await self.rooms.is_host_in_room(room_id, server):
                logger.info(
                    "%s from %s for %.80s, a room %s is not in: dropped",
                    edu_type,
                    origin,
                    room_id,
                    server,
                )
                return False
        return True

    def _own(self, origin: str, user_id: str, edu_type: str) -> bool:
        """Whether ``origin`` may speak for ``user_id`` (logged when not)."""
        if server_of(user_id) == origin:
            return True
        logger.info("%s from %s names %s, of another server: dropped", edu_type, origin, user_id)
        return False

    # -- typing ------------------------------------------------------------------------

    async def _typing(self, origin: str, content: Mapping[str, Any]) -> None:
        room_id = _string(content.get("room_id"), "room_id")
        user_id = _string(content.get("user_id"), "user_id")
        typing = content.get("typing")
        if not isinstance(typing, bool):
            raise InvalidEdu("typing must be a boolean")
        if not self._own(origin, user_id, "m.typing"):
            return
        if not await self._shared_room(origin, room_id, "m.typing"):
            return
        await self._set_typing(room_id, user_id, typing, FEDERATION_TYPING_TIMEOUT_MS)

    # -- receipts ----------------------------------------------------------------------

    async def _receipts(self, origin: str, content: Mapping[str, Any]) -> None:
        for room_id, by_type in content.items():
            try:
                await self._room_receipts(origin, _string(room_id, "room ID"), by_type)
            except InvalidEdu as exc:
                # One room's bad part does not drop the others'.
                logger.info("m.receipt from %s: room %.80s dropped: %s", origin, room_id, exc)

    async def _room_receipts(self, origin: str, room_id: str, by_type: Any) -> None:
        by_type = _mapping(by_type, "receipts of a room")
        if not await self._shared_room(origin, room_id, "m.receipt"):
            return
        for receipt_type, users in by_type.items():
            receipt_type = _string(receipt_type, "receipt type")
            for user_id, receipt in _mapping(users, "receipts of a type").items():
                user_id = _string(user_id, "user ID")
                if not self._own(origin, user_id, "m.receipt"):
                    continue
                receipt = _mapping(receipt, "receipt")
                event_ids = receipt.get("event_ids")
                if (
                    not isinstance(event_ids, list)
                    or not event_ids
                    or len(event_ids) > MAX_RECEIPT_EVENTS
                ):
                    raise InvalidEdu("event_ids must be a non-empty list")
                event_ids = [_string(e, "event ID") for e in event_ids]
                data = receipt.get("data")
                thread_id = data.get("thread_id") if isinstance(data, Mapping) else None
                # As Synapse: an invalid thread ID counts as none.
                if not isinstance(thread_id, str) or len(thread_id) > MAX_ID_LENGTH:
                    thread_id = None
                ts = data.get("ts") if isinstance(data, Mapping) else None
                if isinstance(ts, bool) or not isinstance(ts, int) or not 0 <= ts < 2**53:
                    ts = None  # made "now" (also when absent)
                event_id = event_ids[0]
                if len(event_ids) > 1:
                    latest = await self.db.run_interaction(
                        "federation_receipt_event", _latest_stored_txn, room_id, event_ids
                    )
                    event_id = latest or event_id
                await self._put_receipt(room_id, receipt_type, user_id, event_id, thread_id, ts)

    # -- presence ----------------------------------------------------------------------

    async def _presence(self, origin: str, content: Mapping[str, Any]) -> None:
        if self._put_presence is None:
            return
        push = content.get("push")
        if not isinstance(push, list):
            raise InvalidEdu("push must be a list")
        now = self._clock()
        states: dict[str, UserPresence] = {}
        for entry in push:
            try:
                state = self._presence_state(origin, entry, now)
            except InvalidEdu as exc:
                logger.info("m.presence from %s: an entry dropped: %s", origin, exc)
                continue
            if state is not None:
                states[state.user_id] = state
        if states:
            await self._put_presence(list(states.values()))

    def _presence_state(self, origin: str, entry: Any, now: int) -> UserPresence | None:
        entry = _mapping(entry, "a presence update")
        user_id = _string(entry.get("user_id"), "user_id")
        if not self._own(origin, user_id, "m.presence"):
            return None
        presence = entry.get("presence")
        if presence not in PRESENCE_STATES:
            raise InvalidEdu(f"presence must be one of {', '.join(PRESENCE_STATES)}")
        ago = entry.get("last_active_ago", 0)
        last_active = now - min(_int(ago, "last_active_ago"), now) if ago else 0
        status_msg = entry.get("status_msg")
        if not isinstance(status_msg, str) or len(status_msg) > 4096:
            status_msg = None
        active = entry.get("currently_active") is True and presence == ONLINE
        return UserPresence(user_id, str(presence), last_active, now, 0, status_msg, active)

    # -- device lists and cross-signing ------------------------------------------------

    async def _device_list_update(self, origin: str, content: Mapping[str, Any]) -> None:
        user_id = _string(content.get("user_id"), "user_id")
        if not self._own(origin, user_id, "m.device_list_update"):
            return
        prev_id = content.get("prev_id", [])
        if not isinstance(prev_id, list):
            raise InvalidEdu("prev_id must be a list")
        keys = content.get("keys")
        if keys is not None and not isinstance(keys, Mapping):
            raise InvalidEdu("keys must be an object")
        update = DeviceListUpdate(
            user_id,
            _string(content.get("device_id"), "device_id"),
            _int(content.get("stream_id"), "stream_id"),
            tuple(_int(p, "prev_id") for p in prev_id),
            content.get("deleted") is True,
            keys,
        )
        await self.device_lists.apply_update(update)

    async def _signing_key_update(self, origin: str, content: Mapping[str, Any]) -> None:
        user_id = _string(content.get("user_id"), "user_id")
        if not self._own(origin, user_id, "m.signing_key_update"):
            return
        await self.device_lists.apply_signing_keys(user_id, content)

    # -- to-device ---------------------------------------------------------------------

    async def _direct_to_device(self, origin: str, content: Mapping[str, Any]) -> None:
        sender = _string(content.get("sender"), "sender")
        event_type = _string(content.get("type"), "type")
        message_id = _string(content.get("message_id"), "message_id")
        if not self._own(origin, sender, "m.direct_to_device"):
            return
        messages: dict[str, dict[str, Any]] = {}
        for user_id, by_device in _mapping(content.get("messages"), "messages").items():
            if server_of(str(user_id)) != self.server_name:
                logger.info("m.direct_to_device from %s for %.80s: not ours", origin, user_id)
                continue
            devices = {}
            for device_id, message in _mapping(by_device, "messages of a user").items():
                devices[_string(device_id, "device ID")] = dict(
                    _mapping(message, "a to-device message")
                )
            if devices:
                messages[_string(user_id, "user ID")] = devices
        if messages:
            await self._send_to_device(
                sender, event_type, messages, (FEDERATION_TO_DEVICE, message_id)
            )
