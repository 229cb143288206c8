"""The Matrix Client-Server API over HTTP (aiohttp), served by every roomstream process.

Layers: :mod:`~roomstream.client.server` (routing, the one error-mapping middleware, CORS,
authentication), :mod:`~roomstream.client.request` (parsing and validation), thin handler
modules (``*_routes``), and the services they call: :mod:`roomstream.accounts` for users,
devices and tokens, :mod:`~roomstream.client.rooms` for room actions (written through
:mod:`~roomstream.client.writes` on the room's owning events writer),
:mod:`~roomstream.client.userdata` and :mod:`~roomstream.client.typing` for per-user and
ephemeral data (written on their stream's writer through :mod:`~roomstream.client.writes`;
:mod:`~roomstream.client.forwarded` carries out what other processes forward here),
:mod:`~roomstream.client.notifier` to wake long polls, :mod:`~roomstream.client.profiles`
for profiles (new membership events read them through the event creator's
``member_profile``), :mod:`roomstream.media` for the media repository.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from roomstream.accounts import Accounts, AccountStore
from roomstream.accounts.client_ips import ClientIps
from roomstream.accounts.openid import OpenIdTokens
from roomstream.accounts.profiles import ProfileStore
from roomstream.accounts.service import EndSessions, Keep
from roomstream.accounts.token_cache import TokenCache
from roomstream.client.account_management import AccountManagement
from roomstream.client.account_management_routes import account_management_routes
from roomstream.client.account_routes import account_routes
from roomstream.client.admin_routes import admin_routes
from roomstream.client.backup_routes import backup_routes
from roomstream.client.device_routes import device_routes
from roomstream.client.directory import DirectoryReader
from roomstream.client.directory_routes import directory_routes
from roomstream.client.forwarded import ForwardedWrites
from roomstream.client.ignored import IGNORED_USER_LIST, IgnoredUsers
from roomstream.client.keys_routes import keys_routes
from roomstream.client.legacy import LegacyReads
from roomstream.client.legacy_routes import legacy_routes
from roomstream.client.media_routes import media_routes
from roomstream.client.notifications import Notifications
from roomstream.client.notifier import Notifier
from roomstream.client.openid_routes import openid_routes
from roomstream.client.presence import PresenceTimeouts
from roomstream.client.presence_routes import presence_routes
from roomstream.client.presence_service import PresenceService, PresenceWriter, RemotePresence
from roomstream.client.presence_store import PresenceStore
from roomstream.client.profile_routes import profile_routes
from roomstream.client.profiles import ProfileFanOut, ProfileService
from roomstream.client.push_routes import push_routes
from roomstream.client.push_store import PushRulesStore
from roomstream.client.pushers import PusherPool, PusherStore, parse_pusher
from roomstream.client.pushrules import PUSH_RULES, PushRuleEdit
from roomstream.client.read_routes import read_routes
from roomstream.client.relations_routes import relations_routes
from roomstream.client.remote_history import RemoteHistory
from roomstream.client.remote_keys import KeysWithRemote, RemoteKeys
from roomstream.client.remote_rooms import RemoteRooms
from roomstream.client.reports import Reports
from roomstream.client.room_routes import room_routes
from roomstream.client.rooms import RoomService
from roomstream.client.search_routes import search_routes
from roomstream.client.server import ClientApi
from roomstream.client.sliding_sync import SlidingSyncHandler, sliding_sync_routes
from roomstream.client.space_routes import space_routes
from roomstream.client.spaces import SpaceHierarchy
from roomstream.client.store import ClientStore
from roomstream.client.sync import SyncHandler
from roomstream.client.typing import TypingState, TypingWriter
from roomstream.client.unread import UnreadCounter
from roomstream.client.upgrades import RoomUpgrades
from roomstream.client.userdata import UserData
from roomstream.client.userdata_routes import userdata_routes
from roomstream.client.writes import RoomWriter, UserDataWriter, forwarded_call
from roomstream.config import Config, PresenceConfig
from roomstream.e2e import E2eKeys
from roomstream.e2e.backup import KeyBackup
from roomstream.e2e.service import Forward
from roomstream.errors import MatrixError
from roomstream.media import MediaRepository, open_media
from roomstream.reading import RoomReader
from roomstream.replication import endpoints
from roomstream.replication import endpoints as ep
from roomstream.replication.commands import Command
from roomstream.replication.http import InternalHttpClient
from roomstream.replication.sharding import writer_for_room
from roomstream.rooms.engine import RoomEngine
from roomstream.streams import InMemoryStream, StreamIdGenerator
from roomstream.streams.rows import TypingRow

__all__ = ["ClientApi", "ClientProcess", "build_client_api", "presence_timeouts"]

logger = logging.getLogger(__name__)


class ClientProcess:
    """The client API's services on one process, and the hooks replication feeds."""

    def __init__(
        self,
        config: Config,
        engine: RoomEngine,
        http_client: InternalHttpClient | None,
        *,
        typing_stream: InMemoryStream | None = None,
        announce: Callable[[str], None] | None = None,
        invalidations_live: Callable[[], bool] | None = None,
        send_command: Callable[[Command, str], bool] | None = None,
        stream_live: Callable[[str], bool] | None = None,
        remote_rooms: RemoteRooms | None = None,
        remote_keys: RemoteKeys | None = None,
        remote_history: RemoteHistory | None = None,
    ) -> None:
        """``send_command``: sends a replication command towards an instance (the
        presence writer's ``USER_SYNC``); None: this process tells nobody of its syncs.
        ``invalidations_live``: whether the ``caches`` stream reaches this process as
        it is written (replication's liveness); while it says no, tokens are read from
        the database (:class:`~roomstream.accounts.token_cache.TokenCache`). None: this
        process writes every invalidation itself. ``stream_live``: the same for any
        stream (replication's ``stream_live``), for the caches other streams keep
        correct (the ``device_lists`` stream's: :class:`~roomstream.e2e.keys_cache.
        KeysCache`); None: no replication."""
        self.config = config
        self.remote_history = remote_history
        caches_writer, forward_end_sessions = _token_invalidation(config, engine, http_client)
        self.token_cache = (
            None
            if caches_writer is None and forward_end_sessions is None
            else TokenCache(live=invalidations_live)
        )
        self.accounts = Accounts(
            AccountStore(engine.db),
            config.server_name,
            registration_enabled=config.enable_registration,
            guest_access_enabled=config.allow_guest_access,
            token_cache=self.token_cache,
            caches_writer=caches_writer,
            forward_end_sessions=forward_end_sessions,
        )
        self.store = ClientStore(engine.db)
        self.reader = RoomReader.for_engine(
            engine, format_cache_size=config.caches.formatted_events
        )
        room_writer = RoomWriter(config, engine.creator, http_client)
        self.rooms = RoomService(
            config.server_name,
            room_writer,
            engine.store,
            self.store,
            self.reader,
            remote=remote_rooms,
        )
        profile_store = ProfileStore(engine.db)
        # Joins, invites and knocks created on this process carry the target's profile.
        engine.creator.member_profile = profile_store.member_content
        self.profiles = ProfileService(
            config.server_name,
            profile_store,
            ProfileFanOut(engine.store, room_writer, profile_store),
        )
        reader = self.reader

        async def joined_rooms_of(user_id: str) -> list[str]:
            rooms = await reader.changes.rooms_for_user(user_id)
            return [room_id for room_id, membership in rooms.items() if membership == "join"]

        self.notifier = Notifier(engine.streams, config.instance_name, joined_rooms_of)

        def share_events_rows(
            stream: str, writer: str, since: int, upto: int, updates: list[Any]
        ) -> None:
            if stream == "events":
                reader.ingest_rows(writer, since, upto, updates)

        # The rows read to wake syncs also bring the read path's change caches up to
        # date: the woken sync does not read them a second time.
        self.notifier.local_row_listeners.append(share_events_rows)
        self.userdata = UserData(engine.streams, config.instance_name, config.server_name)
        self.typing_state = TypingState()
        self.typing: TypingWriter | None = None
        #: Told (token, rows) of typing rows this process writes (the ``typing`` stream
        #: is in memory: other processes hear them over replication, this one here).
        self.typing_row_listeners: list[Callable[[int, list[tuple[str, list[str]]]], None]] = []
        if typing_stream is not None:
            stream = typing_stream

            def append_typing(rows: list[tuple[str, list[str]]]) -> int:
                token = stream.append(list(rows))
                if announce is not None:
                    announce("typing")
                self.notifier.notify_rows("typing", rows)
                for listener in self.typing_row_listeners:
                    listener(token, rows)
                return token

            self.typing = TypingWriter(self.typing_state, append_typing)
        self.user_data_writer = UserDataWriter(config, self.userdata, self.typing, http_client)
        userdata = self.userdata

        async def load_ignored(user_id: str) -> dict[str, Any] | None:
            return await userdata.get_account_data(user_id, None, IGNORED_USER_LIST)

        self.ignored = IgnoredUsers(load_ignored)
        ignored = self.ignored
        self.user_data_writer.account_data_written.append(
            lambda user, room, data_type: ignored.on_account_data_rows([(user, room, data_type)])
        )

        user_data_writer = self.user_data_writer

        async def copy_push_rules(user_id: str, document: Mapping[str, Any]) -> None:
            # What clients see in /sync: the rules as their m.push_rules account data.
            await user_data_writer.put_account_data(user_id, None, PUSH_RULES, dict(document))

        #: Push rules: the push_rules stream (its writer here, or forwarded to).
        self.push_rules = PushRulesStore(
            engine.streams,
            config.instance_name,
            forward=_push_rules_forward(config, http_client),
            copy_out=copy_push_rules,
        )

        def forget_ignored(
            stream: str, writer: str, since: int, upto: int, updates: list[Any]
        ) -> None:
            if stream == "events":
                self.pushers.on_new_events()
            if stream == "account_data":
                ignored.on_account_data_rows([row for _, row in updates])

        # This process's own account-data rows (writes forwarded here included).
        self.notifier.local_row_listeners.append(forget_ignored)
        #: Where each device was seen from (GET /admin/whois), and OpenID tokens.
        self.client_ips = ClientIps(engine.db)
        self.openid = OpenIdTokens(engine.db)
        #: Device keys, cross-signing and the device_lists stream.
        self.keys = E2eKeys(
            engine.db,
            engine.streams.generator("device_lists"),
            self.accounts.require_password_auth,
            _e2e_forward(config, http_client),
            cache_live=_keys_cache_live(config, stream_live),
        )
        keys, userdata = self.keys, self.userdata

        async def forget_devices(user_id: str, device_ids: list[str]) -> None:
            # A deleted (logged-out) device's to-device queue and keys go with it.
            for device_id in device_ids:
                await userdata.drop_device_inbox(user_id, device_id)
            await keys.device_deleted(user_id, device_ids)

        self.accounts.devices_deleted_listeners.append(forget_devices)
        #: Presence: the machine on the presence writer, the relay to it elsewhere.
        self.presence = _presence(config, engine, http_client, send_command)
        #: Pushers; the pushers writer delivers their notifications.
        self.pushers = _pushers(config, engine, self.reader, self.push_rules)
        remove_device_pushers = self._remove_device_pushers_call(http_client)

        async def forget_device_pushers(user_id: str, device_ids: list[str]) -> None:
            try:
                await remove_device_pushers(user_id, device_ids)
            except MatrixError:
                # The logout stands (its tokens are gone); the pushers writer being out
                # of reach leaves the pushers until deleted or rejected by the gateway.
                logger.warning("pushers of %s's deleted devices not removed", user_id)

        self.accounts.devices_deleted_listeners.append(forget_device_pushers)
        if keys.writes_device_lists or keys.forwards_writes:
            # Else (no writer to reach) the rename goes unannounced, as before; such a
            # process does not trust its keys cache anyway (see _keys_cache_live).
            self.accounts.device_renamed_listeners.append(keys.device_renamed)
        #: What this process does for writes other processes forward to it.
        self.forwarded = ForwardedWrites(
            self.accounts,
            self.rooms,
            self.userdata,
            self.typing,
            self.keys,
            self.presence.writer,
            self.pushers if self.pushers.delivers else None,
            self.push_rules if self.push_rules.writes else None,
        )
        #: The media repository (uploads, downloads, thumbnails).
        self.media: MediaRepository = open_media(config, engine.db)
        #: Users' reports of events and rooms, for admins.
        self.reports = Reports(engine.db, self.reader, engine.store)
        legacy = LegacyReads(self.reader, engine.store, self.store, self.userdata, self.notifier)
        self.api = ClientApi(
            self.accounts,
            [
                *account_routes(self.accounts),
                *account_management_routes(
                    self.accounts,
                    AccountManagement(self.accounts, self.rooms),
                    config.client_base_url(),
                ),
                *room_routes(self.accounts, self.rooms),
                *read_routes(
                    self.accounts,
                    self.rooms,
                    self.store,
                    self.reader,
                    SyncHandler(
                        self.reader,
                        self.userdata,
                        self.typing_state,
                        self.notifier,
                        self.store,
                        ignored=self.ignored,
                        keys=self.keys,
                        presence=self.presence.store,
                        push_rules=self.push_rules,
                    ),
                    self.ignored,
                    presence=self.presence,
                    remote_history=self.remote_history,
                ),
                *relations_routes(self.accounts, self.reader, self.ignored),
                *sliding_sync_routes(
                    self.accounts,
                    SlidingSyncHandler(
                        self.reader,
                        self.userdata,
                        self.typing_state,
                        self.notifier,
                        keys=self.keys,
                    ),
                    presence=self.presence,
                ),
                *directory_routes(self.accounts, DirectoryReader(engine.db), config.server_name),
                *profile_routes(self.accounts, self.profiles),
                *userdata_routes(
                    self.accounts,
                    self.rooms,
                    self.store,
                    self.userdata,
                    self.notifier,
                    self.user_data_writer,
                ),
                *legacy_routes(self.accounts, self.rooms, self.reader, legacy),
                *admin_routes(self.accounts, self.client_ips),
                *openid_routes(self.accounts, self.openid),
                *keys_routes(
                    self.accounts,
                    self.keys,
                    KeysWithRemote(self.keys, config.server_name, remote_keys),
                ),
                *device_routes(self.accounts, self.keys, self.client_ips),
                *backup_routes(self.accounts, KeyBackup(engine.db)),
                *media_routes(self.accounts, self.media),
                *presence_routes(self.accounts, self.presence),
                *space_routes(
                    self.accounts,
                    SpaceHierarchy(engine.db),
                    RoomUpgrades(self.rooms),
                    self.reports,
                    self.reader,
                ),
                *push_routes(
                    self.accounts,
                    self.push_rules,
                    Notifications(self.reader, self.push_rules),
                    self.pushers.store,
                    self._set_pusher_call(http_client),
                ),
                *search_routes(self.accounts, self.reader, self.ignored),
            ],
            self.client_ips,
        )

    # -- replication hooks -------------------------------------------------------------

    def on_replicated_rows(
        self, stream_name: str, writer: str, token: int, rows: Sequence[Any]
    ) -> None:
        if stream_name == "typing":
            for row in map(TypingRow.from_wire, rows):
                self.typing_state.apply(token, str(row.room_id), list(row.user_ids))
        elif stream_name == "account_data":
            self.ignored.on_account_data_rows(rows)
        elif stream_name == "push_rules":
            self.push_rules.on_push_rules_rows(rows)
        elif stream_name == "caches" and self.token_cache is not None:
            for row in rows:
                self.token_cache.apply_cache_row(row)
        elif stream_name == "device_lists":
            self.keys.apply_device_lists_rows(rows)
        self.notifier.on_replicated_rows(stream_name, writer, token, rows)

    def on_replicated_position(self, stream_name: str, writer: str, position: int) -> None:
        self.notifier.on_replicated_position(stream_name, writer, position)
        if stream_name == "events":
            self.pushers.on_new_events()

    def _set_pusher_call(
        self, http_client: InternalHttpClient | None
    ) -> Callable[[str, str | None, dict[str, Any]], Awaitable[None]]:
        pool = self.pushers
        writer = self.config.writers_of("pushers")[0]

        async def set_pusher(user_id: str, device_id: str | None, body: dict[str, Any]) -> None:
            if pool.delivers or http_client is None:
                pusher, append = parse_pusher(user_id, body, device_id)
                await pool.set(pusher, append, user_id)
                return
            call = ep.PusherCall(user_id, body, device_id)
            await forwarded_call(writer, http_client.call(ep.PUSHER, writer, call))

        return set_pusher

    def _remove_device_pushers_call(
        self, http_client: InternalHttpClient | None
    ) -> Callable[[str, list[str]], Awaitable[None]]:
        """Deleted devices lose their pushers, on the pushers writer (here or
        forwarded), as Synapse's ``remove_pushers_by_devices``."""
        pool = self.pushers
        writer = self.config.writers_of("pushers")[0]

        async def remove(user_id: str, device_ids: list[str]) -> None:
            # Read here first: most logouts have no pushers to remove, and then no
            # writer is bothered (a pusher set meanwhile by a deleted device cannot be:
            # its tokens are gone).
            pushers = await pool.store.list_for_user(user_id)
            device_ids = [d for d in device_ids if any(p.device_id == d for p in pushers)]
            if not device_ids:
                return
            if pool.delivers or http_client is None:
                await pool.remove_for_devices(user_id, device_ids)
                return
            for device_id in device_ids:
                call = ep.DevicePushersCall(user_id, device_id)
                await forwarded_call(writer, http_client.call(ep.DEVICE_PUSHERS, writer, call))

        return remove

    async def start(self) -> None:
        """Start what runs in the background (presence: restoring states, the relay's
        bookkeeping; the pushers' deliveries on their writer; the media sweep); the API
        serves without it (a fresh presence writer, no relay, no pushes, no sweep)."""
        await self.presence.start()
        await self.pushers.start()
        # Every process with the media repository sweeps (concurrent sweeps are safe).
        self.media.start_sweeping()

    def close(self) -> None:
        self.pushers.close()
        self.media.close()
        self.presence.close()
        self.client_ips.close()
        self.notifier.close()
        self.profiles.fanout.close()
        if self.typing is not None:
            self.typing.close()


def presence_timeouts(config: PresenceConfig) -> PresenceTimeouts:
    """The machine's timeouts (ms) from the configuration's (seconds)."""
    return PresenceTimeouts(
        idle_ms=round(config.idle_timeout * 1000),
        sync_online_ms=round(config.sync_timeout * 1000),
        last_active_granularity_ms=round(config.last_active_granularity * 1000),
        process_expiry_ms=round(config.process_expiry * 1000),
    )


def _presence(
    config: Config,
    engine: RoomEngine,
    http_client: InternalHttpClient | None,
    send_command: Callable[[Command, str], bool] | None,
) -> PresenceService:
    """The presence writer's machine here, or the relay to the one writer (a process
    that can reach neither writes presence itself, as a single process does)."""
    store = PresenceStore(engine.db, engine.streams.generator("presence"))
    timeouts = presence_timeouts(config.presence)
    enabled = config.presence.enabled
    writer_name = config.writers_of("presence")[0]
    if writer_name == config.instance_name or http_client is None or send_command is None:
        writer = PresenceWriter(store, timeouts, config.instance_name)
        return PresenceService(store, writer=writer, enabled=enabled)
    if writer_name not in config.instances:
        # The default writer (main) is not part of this deployment: nobody could track
        # presence, so it is off here rather than failing every sync's relay.
        logger.info("presence is off: its writer %s is not among the instances", writer_name)
        return PresenceService(store, enabled=False)
    client = http_client
    sender = send_command

    async def relay(
        user_id: str, device_id: str | None, presence: str, status_msg: str | None, is_sync: bool
    ) -> None:
        call = ep.PresenceCall(user_id, presence, device_id, status_msg, is_sync)
        await forwarded_call(writer_name, client.call(ep.PRESENCE, writer_name, call))

    remote = RemotePresence(
        config.instance_name, timeouts, relay, lambda cmd: sender(cmd, writer_name)
    )
    return PresenceService(store, remote=remote, enabled=enabled)


def _keys_cache_live(
    config: Config, stream_live: Callable[[str], bool] | None
) -> Callable[[], bool] | None:
    """When this process may trust its cache of users' keys: always when it writes the
    whole ``device_lists`` stream itself (every change invalidates it here at once);
    else while replication brings the other writers' rows as they are written; never
    when it has no replication to tell (it would not hear of their changes)."""
    if config.writers_of("device_lists") == (config.instance_name,):
        return None
    if stream_live is None:
        return lambda: False
    live = stream_live
    return lambda: live("device_lists")


def _e2e_forward(config: Config, http_client: InternalHttpClient | None) -> Forward | None:
    """How this process has the ``device_lists`` writer (the one the user hashes to)
    carry out key writes that add a row to that stream; None when it writes it itself
    (or has nobody to forward to)."""
    writers = config.writers_of("device_lists")
    if config.instance_name in writers or http_client is None:
        return None
    client = http_client

    async def forward(op: str, args: dict[str, Any]) -> Any:
        writer = writer_for_room(str(args["user_id"]), writers)
        return await forwarded_call(
            writer, client.call(endpoints.E2E_KEYS, writer, endpoints.E2eKeysCall(op, args))
        )

    return forward


def _token_invalidation(
    config: Config, engine: RoomEngine, http_client: InternalHttpClient | None
) -> tuple[StreamIdGenerator | None, EndSessions | None]:
    """How this process ends sessions so that every process's token cache forgets them:
    it writes the ``caches`` stream itself, or forwards to the process that does. Neither
    (no ``caches`` writer among the configured instances with an ``internal_port``): no
    token cache."""
    if "caches" not in engine.streams:
        return None, None
    generator = engine.streams.generator("caches")
    if generator.is_writer():
        return generator, None
    writer = config.writers_of("caches")[0]
    if http_client is None or not config.instance(writer).internal_port:
        return None, None  # cannot reach it: logouts could not end tokens elsewhere
    client = http_client

    async def forward(user_id: str, device_id: str | None, keep: Keep | None) -> None:
        call = ep.EndSessionsCall(
            user_id,
            device_id,
            None if keep is None else keep.device_id,
            None if keep is None else keep.token_hash,
        )
        await forwarded_call(writer, client.call(ep.END_SESSIONS, writer, call))

    return None, forward


def build_client_api(
    config: Config,
    engine: RoomEngine,
    http_client: InternalHttpClient | None,
    *,
    typing_stream: InMemoryStream | None = None,
    announce: Callable[[str], None] | None = None,
    invalidations_live: Callable[[], bool] | None = None,
    send_command: Callable[[Command, str], bool] | None = None,
    stream_live: Callable[[str], bool] | None = None,
    remote_rooms: RemoteRooms | None = None,
    remote_keys: RemoteKeys | None = None,
    remote_history: RemoteHistory | None = None,
) -> ClientProcess:
    """The Client-Server API of this instance; ``.api.install`` puts it on an app.
    ``remote_rooms``, ``remote_keys``, ``remote_history``: other servers' rooms, users'
    end-to-end keys and rooms' older history (federation), or None without federation."""
    return ClientProcess(
        config,
        engine,
        http_client,
        typing_stream=typing_stream,
        announce=announce,
        invalidations_live=invalidations_live,
        send_command=send_command,
        stream_live=stream_live,
        remote_rooms=remote_rooms,
        remote_keys=remote_keys,
        remote_history=remote_history,
    )


def _push_rules_forward(
    config: Config, http_client: InternalHttpClient | None
) -> Callable[[str, PushRuleEdit], Awaitable[None]] | None:
    """How this process has the ``push_rules`` writer carry out an edit of a user's
    rules; None when it writes them itself (it is the writer, or reaches no other)."""
    writer = config.writers_of("push_rules")[0]
    if writer == config.instance_name or http_client is None:
        return None
    client = http_client

    async def forward(user_id: str, change: PushRuleEdit) -> None:
        call = ep.PushRuleEditCall(
            user_id,
            change.op,
            change.kind,
            change.rule_id,
            dict(change.body),
            change.before,
            change.after,
        )
        await forwarded_call(writer, client.call(ep.PUSH_RULE_EDIT, writer, call))

    return forward


def _pushers(
    config: Config, engine: RoomEngine, reader: RoomReader, push_rules: PushRulesStore
) -> PusherPool:
    """The pusher pool: delivering on the ``pushers`` writer, a store elsewhere."""
    counter = UnreadCounter(reader, push_rules.rules_of)
    events = engine.streams.generator("events")

    async def unread_rooms(user_id: str) -> int:
        # The badge: rooms with unread notifications (Synapse's group_by_room default).
        rooms = await reader.changes.rooms_for_user(user_id)
        joined = [r for r, membership in rooms.items() if membership == "join"]
        counts = await counter.counts(user_id, joined)
        return sum(1 for c in counts.values() if c["notification_count"] > 0)

    return PusherPool(
        PusherStore(engine.streams, config.instance_name),
        push_rules,
        events.get_linear_position,
        unread_rooms,
        delivers=config.instance_name == config.writers_of("pushers")[0],
    )
