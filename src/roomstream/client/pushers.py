"""Pushers (spec, "Push Notifications"): ``GET /pushers``, ``POST /pushers/set`` and the
delivery of each user's notifications to their push gateways.

The ``pushers`` stream has one writer (``stream_writers.pushers``, default main): it
stores every pusher change (other processes forward ``/pushers/set`` there) and it alone
delivers (:class:`PusherPool`), so no notification is sent by two processes.

Delivery, per pusher (:class:`Pusher`), as Synapse's HTTP pusher:

- the notifications are the user's (:func:`roomstream.client.notifications.
  notifying_events_txn`: their rules, their joined rooms, never their own events) above
  the pusher's ``last_stream_ordering``, oldest first, up to the events position every
  writer has completed: in the order the events arrived;
- each is one ``POST {data.url}`` (``/_matrix/push/v1/notify``) in the spec's format
  (``data.format: event_id_only`` sends only IDs, counts and devices); a failure (no
  answer, a non-2xx status) is retried after a backoff doubling from
  :attr:`PusherPool.initial_backoff` up to :data:`MAX_BACKOFF_S`, the later
  notifications waiting behind it; after failing for :data:`GIVE_UP_MS` a notification
  is skipped, as Synapse gives up;
- the position is stored after each delivered notification, so a restart continues
  after the last one delivered. A crash between the gateway's answer and that write
  sends the one notification again (at least once, as Synapse; the gateway can tell by
  ``event_id``); nothing delivered before it is sent again;
- pushkeys the gateway answers as ``rejected`` lose their pusher.

Invariant of the tables: ``pushers.last_stream_ordering`` only grows.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from roomstream.client.notifications import Found, Notification, notifying_events_txn
from roomstream.client.push_store import PushRulesStore
from roomstream.errors import BadJsonError, BadRequestError, InvalidParamError, MissingParamError
from roomstream.events.types import EventTypes
from roomstream.rooms.store import load_events_txn
from roomstream.storage import Transaction
from roomstream.streams import StreamSet

__all__ = ["PusherPool", "PusherStore", "parse_pusher"]

logger = logging.getLogger(__name__)

NOTIFY_PATH = "/_matrix/push/v1/notify"
MAX_APP_ID_LENGTH = 64
MAX_PUSHKEY_LENGTH = 512
MAX_BACKOFF_S = 3600.0
GIVE_UP_MS = 24 * 3600 * 1000
#: Notifications read per database interaction.
BATCH = 50
REQUEST_TIMEOUT_S = 30
_FIELDS = ("app_id", "pushkey", "kind", "app_display_name", "device_display_name", "lang", "data")


@dataclass(frozen=True)
class PusherConfig:
    """A pusher as ``GET /pushers`` shows it."""

    user_id: str
    app_id: str
    pushkey: str
    kind: str
    app_display_name: str
    device_display_name: str
    profile_tag: str | None
    lang: str
    data: dict[str, Any]
    #: The device that set it (None: unknown, set before devices were recorded); the
    #: pusher goes when the device is deleted (logged out).
    device_id: str | None = None
    #: When it was last set (ms since the epoch); 0 for one not stored yet.
    pushkey_ts: int = 0

    def to_json(self) -> dict[str, Any]:
        body = {f: getattr(self, f) for f in _FIELDS}
        if self.profile_tag is not None:
            body["profile_tag"] = self.profile_tag
        return body

    @property
    def url(self) -> str:
        return str(self.data["url"])


def _string(body: Mapping[str, Any], name: str) -> str:
    value = body.get(name)
    if value is None:
        raise MissingParamError(f"missing {name}")
    if not isinstance(value, str):
        raise BadJsonError(f"{name} must be a string")
    return value


def parse_pusher(
    user_id: str, body: Mapping[str, Any], device_id: str | None = None
) -> tuple[PusherConfig | None, bool]:
    """A ``POST /pushers/set`` body from ``device_id``: the pusher to set (``kind`` ""
    with ``kind`` null: delete the one with ``app_id`` and ``pushkey``) and ``append``."""
    app_id, pushkey = _string(body, "app_id"), _string(body, "pushkey")
    if not app_id or len(app_id) > MAX_APP_ID_LENGTH:
        raise InvalidParamError(f"app_id must be 1-{MAX_APP_ID_LENGTH} characters")
    if not pushkey or len(pushkey) > MAX_PUSHKEY_LENGTH:
        raise InvalidParamError(f"pushkey must be 1-{MAX_PUSHKEY_LENGTH} characters")
    append = body.get("append", False)
    if not isinstance(append, bool):
        raise BadJsonError("append must be a boolean")
    kind = body.get("kind")
    if kind is None:
        return PusherConfig(user_id, app_id, pushkey, "", "", "", None, "", {}), append
    if kind != "http":
        raise InvalidParamError("only http pushers are supported")
    data = body.get("data")
    if not isinstance(data, dict):
        raise MissingParamError("missing data")
    url = data.get("url")
    if not isinstance(url, str):
        raise BadRequestError("an http pusher's data needs a url")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path != NOTIFY_PATH:
        raise BadRequestError(f"data.url must be an http(s) URL with the path {NOTIFY_PATH}")
    if "format" in data and data["format"] != "event_id_only":
        raise BadRequestError("data.format may only be event_id_only")
    profile_tag = body.get("profile_tag")
    if profile_tag is not None and not isinstance(profile_tag, str):
        raise BadJsonError("profile_tag must be a string")
    pusher = PusherConfig(
        user_id,
        app_id,
        pushkey,
        kind,
        _string(body, "app_display_name"),
        _string(body, "device_display_name"),
        profile_tag,
        _string(body, "lang"),
        data,
        device_id,
    )
    return pusher, append


_COLUMNS = (
    "user_id, app_id, pushkey, kind, app_display_name, device_display_name, profile_tag, lang,"
    " data, device_id, pushkey_ts"
)


def _from_row(row: Sequence[Any]) -> PusherConfig:
    user_id, app_id, pushkey, kind, app_name, device_name, tag, lang, data = row[:9]
    device_id, pushkey_ts = row[9:11]
    return PusherConfig(
        str(user_id),
        str(app_id),
        str(pushkey),
        str(kind),
        str(app_name),
        str(device_name),
        None if tag is None else str(tag),
        str(lang),
        orjson.loads(data),
        None if device_id is None else str(device_id),
        int(pushkey_ts),
    )


@dataclass
class _State:
    """A pusher's delivery state, as stored."""

    config: PusherConfig
    position: int
    failing_since: int | None


class PusherStore:
    """The ``pushers`` and ``deleted_pushers`` tables (their one writer module)."""

    def __init__(self, streams: StreamSet, instance_name: str) -> None:
        self.streams = streams
        self.db = streams.database
        self.instance_name = instance_name

    async def list_for_user(self, user_id: str) -> list[PusherConfig]:
        rows = await self.db.run_interaction(
            "get_pushers",
            lambda t: t.query(
                f"SELECT {_COLUMNS} FROM pushers WHERE user_id = ? ORDER BY app_id, pushkey",
                (user_id,),
            ),
        )
        return [_from_row(r) for r in rows]

    async def all_states(self) -> list[_State]:
        rows = await self.db.run_interaction(
            "all_pushers",
            lambda t: t.query(
                f"SELECT {_COLUMNS}, last_stream_ordering, failing_since FROM pushers", ()
            ),
        )
        return [
            _State(_from_row(r), int(r[11]), None if r[12] is None else int(r[12])) for r in rows
        ]

    async def set(
        self, pusher: PusherConfig, append: bool, position: int
    ) -> tuple[PusherConfig, list[PusherConfig]]:
        """Add or replace ``pusher`` (a new one delivers events above ``position``),
        stamped with the time now; without ``append``, the other users' pushers of its
        app_id and pushkey go. A replaced pusher keeps the device it had, as Synapse's
        (one device may change another's pusher). Returns (the pusher as stored,
        removed)."""
        generator = self.streams.generator("pushers")
        instance = self.instance_name

        now = int(time.time() * 1000)

        def txn(t: Transaction, ids: list[int]) -> tuple[PusherConfig, list[PusherConfig]]:
            removed = []
            if not append:
                removed = [
                    _from_row(r)
                    for r in t.query(
                        f"SELECT {_COLUMNS} FROM pushers"
                        " WHERE app_id = ? AND pushkey = ? AND user_id <> ?",
                        (pusher.app_id, pusher.pushkey, pusher.user_id),
                    )
                ]
                for gone in removed:
                    _delete_txn(t, ids[0], instance, gone)
            t.execute(
                "INSERT INTO pushers (stream_id, instance_name, user_id, app_id, pushkey, kind,"
                " app_display_name, device_display_name, profile_tag, lang, data, pushkey_ts,"
                " last_stream_ordering, device_id)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (app_id, pushkey, user_id) DO UPDATE SET"
                " stream_id = excluded.stream_id, instance_name = excluded.instance_name,"
                " kind = excluded.kind, app_display_name = excluded.app_display_name,"
                " device_display_name = excluded.device_display_name,"
                " profile_tag = excluded.profile_tag, lang = excluded.lang, data = excluded.data,"
                " pushkey_ts = excluded.pushkey_ts,"
                " device_id = COALESCE(pushers.device_id, excluded.device_id)",
                (
                    ids[0],
                    instance,
                    pusher.user_id,
                    pusher.app_id,
                    pusher.pushkey,
                    pusher.kind,
                    pusher.app_display_name,
                    pusher.device_display_name,
                    pusher.profile_tag,
                    pusher.lang,
                    orjson.dumps(pusher.data).decode(),
                    now,
                    position,
                    pusher.device_id,
                ),
            )
            row = t.query_one(
                f"SELECT {_COLUMNS} FROM pushers WHERE app_id = ? AND pushkey = ? AND user_id = ?",
                (pusher.app_id, pusher.pushkey, pusher.user_id),
            )
            assert row is not None  # just written
            return _from_row(row), removed

        _, (stored, removed) = await generator.run_with_ids("set_pusher", 1, txn)
        return stored, removed

    async def delete(self, user_id: str, app_id: str, pushkey: str) -> bool:
        generator = self.streams.generator("pushers")
        instance = self.instance_name

        def txn(t: Transaction, ids: list[int]) -> bool:
            row = t.query_one(
                "SELECT 1 FROM pushers WHERE app_id = ? AND pushkey = ? AND user_id = ?",
                (app_id, pushkey, user_id),
            )
            if row is None:
                return False
            gone = PusherConfig(user_id, app_id, pushkey, "", "", "", None, "", {})
            _delete_txn(t, ids[0], instance, gone)
            return True

        _, deleted = await generator.run_with_ids("delete_pusher", 1, txn)
        return bool(deleted)

    async def delete_for_devices(
        self, user_id: str, device_ids: Sequence[str]
    ) -> list[PusherConfig]:
        """Delete the user's pushers set by any of ``device_ids`` (deleted devices);
        returns them."""
        generator = self.streams.generator("pushers")
        instance = self.instance_name
        devices = list(device_ids)

        def txn(t: Transaction, ids: list[int]) -> list[PusherConfig]:
            gone = [
                _from_row(r)
                for r in t.query(
                    f"SELECT {_COLUMNS} FROM pushers WHERE user_id = ?"
                    f" AND device_id IN ({','.join('?' * len(devices))})",
                    (user_id, *devices),
                )
            ]
            for pusher in gone:
                _delete_txn(t, ids[0], instance, pusher)
            return gone

        if not devices:
            return []
        _, gone = await generator.run_with_ids("delete_device_pushers", 1, txn)
        return gone

    async def advance(
        self, pusher: PusherConfig, position: int, success: bool, failing_since: int | None
    ) -> None:
        """Store a pusher's delivery state (the position never moves back)."""
        now = int(time.time() * 1000)
        await self.db.run_interaction(
            "advance_pusher",
            lambda t: t.execute(
                "UPDATE pushers SET last_stream_ordering = ?, failing_since = ?,"
                " last_success_ts = CASE WHEN ? THEN ? ELSE last_success_ts END"
                " WHERE app_id = ? AND pushkey = ? AND user_id = ?"
                " AND last_stream_ordering <= ?",
                (
                    position,
                    failing_since,
                    success,
                    now,
                    pusher.app_id,
                    pusher.pushkey,
                    pusher.user_id,
                    position,
                ),
            ),
        )

    async def mark_failing(self, pusher: PusherConfig, since: int) -> None:
        await self.db.run_interaction(
            "pusher_failing",
            lambda t: t.execute(
                "UPDATE pushers SET failing_since = ?"
                " WHERE app_id = ? AND pushkey = ? AND user_id = ?",
                (since, pusher.app_id, pusher.pushkey, pusher.user_id),
            ),
        )


def _delete_txn(t: Transaction, stream_id: int, instance: str, pusher: PusherConfig) -> None:
    key = (pusher.app_id, pusher.pushkey, pusher.user_id)
    t.execute("DELETE FROM pushers WHERE app_id = ? AND pushkey = ? AND user_id = ?", key)
    t.execute(
        "INSERT INTO deleted_pushers (stream_id, instance_name, user_id, app_id, pushkey)"
        " VALUES (?, ?, ?, ?, ?)",
        (stream_id, instance, pusher.user_id, pusher.app_id, pusher.pushkey),
    )


Counts = Callable[[str], Awaitable[int]]


class Pusher:
    """One pusher's delivery loop (see the module docstring)."""

    def __init__(self, pool: PusherPool, state: _State) -> None:
        self.pool = pool
        self.config = state.config
        self.position = state.position
        self.failing_since = state.failing_since
        self.wake = asyncio.Event()
        self.wake.set()
        self.task: asyncio.Task[None] | None = None
        #: The gateway rejected the pushkey: the pusher is deleted and its loop ends.
        self.removed = False

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name=f"pusher {self.config.user_id}")

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()

    async def _run(self) -> None:
        while not self.removed:
            await self.wake.wait()
            self.wake.clear()
            try:
                await self._deliver_all()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("pusher of %s failed; it retries", self.config.user_id)
                await asyncio.sleep(self.pool.initial_backoff)
                self.wake.set()

    async def _deliver_all(self) -> None:
        pool = self.pool
        while True:
            upto = pool.events_position()
            if upto <= self.position:
                return
            rules = await pool.push_rules.rules_of(self.config.user_id)
            found = await pool.store.db.run_interaction(
                "pusher_notifications", self._notifications_txn, rules, upto
            )
            for notification in found.notifications:
                if not await self._deliver(notification):
                    return  # the pusher is gone
            end = upto if not found.more or found.scanned_to is None else found.scanned_to
            if end > self.position:
                self.position = end
                await pool.store.advance(self.config, end, False, self.failing_since)
            if not found.more:
                return

    def _notifications_txn(self, txn: Transaction, rules: Mapping[str, Any], upto: int) -> Found:
        return notifying_events_txn(
            txn, rules, self.config.user_id, after=self.position, upto=upto, limit=BATCH
        )

    async def _deliver(self, notification: Notification) -> bool:
        """Send until the gateway takes it (or it is given up on); store the position.
        False: the gateway rejected the pushkey and the pusher was deleted."""
        pool = self.pool
        backoff = pool.initial_backoff
        body = await pool.notify_body(self.config, notification)
        while True:
            outcome = await pool.post(self.config, body)
            if outcome is not None:
                self.failing_since = None
                self.position = notification.stream_ordering
                await pool.store.advance(self.config, self.position, True, None)
                if self.config.pushkey in outcome:
                    self.removed = True
                    await pool.remove(self.config)
                    return False
                return True
            now = int(time.time() * 1000)
            if self.failing_since is None:
                self.failing_since = now
                await pool.store.mark_failing(self.config, now)
            elif now - self.failing_since > GIVE_UP_MS:
                logger.warning("giving up on %s for %s", notification.event_id, self.config.url)
                self.position = notification.stream_ordering
                await pool.store.advance(self.config, self.position, False, self.failing_since)
                return True
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)


class PusherPool:
    """The pushers of every user, delivered by the ``pushers`` writer (``delivers``);
    elsewhere only the store is used, through forwarding."""

    def __init__(
        self,
        store: PusherStore,
        push_rules: PushRulesStore,
        events_position: Callable[[], int],
        unread_count: Counts,
        *,
        delivers: bool,
        initial_backoff: float = 1.0,
    ) -> None:
        self.store = store
        self.push_rules = push_rules
        self.events_position = events_position
        self.unread_count = unread_count
        self.delivers = delivers
        #: Seconds before the first retry of a failed delivery (then doubling).
        self.initial_backoff = initial_backoff
        self._pushers: dict[tuple[str, str, str], Pusher] = {}
        self._session: aiohttp.ClientSession | None = None
        self._started = False
        self._closing: asyncio.Future[None] | None = None

    @staticmethod
    def _key(config: PusherConfig) -> tuple[str, str, str]:
        return (config.app_id, config.pushkey, config.user_id)

    async def start(self) -> None:
        """Load the stored pushers and start delivering (on the writer only)."""
        if not self.delivers or self._started:
            return
        self._started = True
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        )
        for state in await self.store.all_states():
            self._add(state)

    def _add(self, state: _State) -> None:
        key = self._key(state.config)
        old = self._pushers.pop(key, None)
        if old is not None:
            old.stop()
        pusher = Pusher(self, state)
        self._pushers[key] = pusher
        pusher.start()

    def on_new_events(self) -> None:
        """New events may be complete: every pusher looks (one query each)."""
        for pusher in self._pushers.values():
            pusher.wake.set()

    async def set(self, pusher: PusherConfig | None, append: bool, user_id: str) -> None:
        """``POST /pushers/set`` carried out here (the writer)."""
        assert pusher is not None
        if not pusher.kind:
            if await self.store.delete(user_id, pusher.app_id, pusher.pushkey):
                self._stop(self._key(pusher))
            return
        position = self.events_position()
        stored, removed = await self.store.set(pusher, append, position)
        for gone in removed:
            self._stop(self._key(gone))
        if self._started:
            current = self._pushers.get(self._key(stored))
            kept = position if current is None else current.position
            self._add(_State(stored, kept, None))

    async def remove_for_devices(self, user_id: str, device_ids: Sequence[str]) -> None:
        """The devices were deleted (logged out): their pushers go, here (the writer)."""
        for gone in await self.store.delete_for_devices(user_id, device_ids):
            logger.info("pusher %s of %s removed with its device", gone.app_id, user_id)
            self._stop(self._key(gone))

    def _stop(self, key: tuple[str, str, str]) -> None:
        old = self._pushers.pop(key, None)
        if old is not None:
            old.stop()

    async def remove(self, config: PusherConfig) -> None:
        await self.store.delete(config.user_id, config.app_id, config.pushkey)
        self._pushers.pop(self._key(config), None)

    async def post(self, config: PusherConfig, body: Mapping[str, Any]) -> list[str] | None:
        """The gateway's ``rejected`` pushkeys, or None when it did not take the
        notification (no answer, a status other than 2xx)."""
        assert self._session is not None
        try:
            async with self._session.post(
                config.url, data=orjson.dumps(body), headers={"Content-Type": "application/json"}
            ) as resp:
                if resp.status // 100 != 2:
                    logger.info("push gateway %s answered %s", config.url, resp.status)
                    return None
                try:
                    answer = orjson.loads(await resp.read())
                except orjson.JSONDecodeError:
                    return []
                rejected = answer.get("rejected") if isinstance(answer, dict) else None
                return (
                    [r for r in rejected if isinstance(r, str)]
                    if isinstance(rejected, list)
                    else []
                )
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            logger.info("push gateway %s unreachable: %s", config.url, exc)
            return None

    async def notify_body(self, config: PusherConfig, item: Notification) -> dict[str, Any]:
        """The spec's ``POST /_matrix/push/v1/notify`` body for one notification."""
        tweaks = {
            a["set_tweak"]: a.get("value", True)
            for a in item.actions
            if isinstance(a, dict) and isinstance(a.get("set_tweak"), str)
        }
        data = {k: v for k, v in config.data.items() if k != "url"}
        device = {
            "app_id": config.app_id,
            "pushkey": config.pushkey,
            # Seconds, as the spec says and Synapse sends.
            "pushkey_ts": config.pushkey_ts // 1000,
            "data": data,
            "tweaks": tweaks,
        }
        unread = await self.unread_count(config.user_id)
        event = await self.store.db.run_interaction(
            "pusher_event", _event_details_txn, item.room_id, item.event_id
        )
        high = (
            event["type"] == EventTypes.ENCRYPTED
            or bool(tweaks.get("highlight"))
            or "sound" in tweaks
        )
        notification: dict[str, Any] = {
            "event_id": item.event_id,
            "room_id": item.room_id,
            "counts": {"unread": unread},
            "prio": "high" if high else "low",
            "devices": [device],
        }
        if config.data.get("format") != "event_id_only":
            notification.update({k: v for k, v in event.items() if v is not None})
            if event.get("state_key") is not None:
                notification["user_is_target"] = event["state_key"] == config.user_id
            notification.pop("state_key", None)
        return {"notification": notification}

    def close(self) -> None:
        for pusher in self._pushers.values():
            pusher.stop()
        self._pushers.clear()
        if self._session is not None:
            session, self._session = self._session, None
            self._closing = asyncio.ensure_future(session.close())


def _event_details_txn(txn: Transaction, room_id: str, event_id: str) -> dict[str, Any]:
    """The notification's event fields: type, sender, content, the sender's display name
    and the room's name (from the current state)."""
    ids = {
        (str(t), str(k)): str(e)
        for t, k, e in txn.query(
            "SELECT type, state_key, event_id FROM current_state_events WHERE room_id = ?"
            " AND type IN ('m.room.name', 'm.room.member', 'm.room.canonical_alias')",
            (room_id,),
        )
    }
    event = load_events_txn(txn, [event_id]).get(event_id)
    if event is None:
        return {"type": None}
    sender = str(event.data.get("sender", ""))
    wanted = [
        ids.get(k)
        for k in (
            (EventTypes.NAME, ""),
            (EventTypes.MEMBER, sender),
            (EventTypes.CANONICAL_ALIAS, ""),
        )
    ]
    loaded = load_events_txn(txn, [w for w in wanted if w])
    name_ev, member_ev, alias_ev = (loaded.get(w) if w else None for w in wanted)

    def field(ev: Any, key: str) -> Any:
        value = None if ev is None else ev.content.get(key)
        return value if isinstance(value, str) else None

    return {
        "type": event.data.get("type"),
        "sender": sender,
        "content": event.data.get("content"),
        "state_key": event.data.get("state_key"),
        "sender_display_name": field(member_ev, "displayname"),
        "room_name": field(name_ev, "name"),
        "room_alias": field(alias_ev, "alias"),
    }
