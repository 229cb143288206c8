"""roomstream's one configuration file (YAML), with defaults that work with no file at all.

Example (every key optional)::

    server_name: example.org
    instance_name: main            # which process this is
    data_dir: ./data
    database:
      engine: sqlite               # or postgres
      path: ./data/roomstream.db
      dsn: postgresql://postgres@127.0.0.1:5432/roomstream
    stream_writers:                # stream -> the instances that write it
      events: [writer1, writer2]
    instances:                     # where each instance listens (default: main on
      main: {replication_port: 9092, http_port: 8008, internal_port: 9093}  # 127.0.0.1)
      # http_port: the Matrix Client-Server API (/_matrix, /.well-known) only;
      # internal_port: the internal API (/_roomstream/replication/..., /metrics), always
      # behind the shared secret; an instance without one cannot be forwarded to
    replication:
      transport: tcp               # or redis
      shared_secret: null          # null: generated in <data_dir>/replication_secret
                                   # (mode 0600) at first start; required when a
                                   # listener binds beyond loopback
    redis: {host: 127.0.0.1, port: 6379}
    enable_registration: true      # open POST /_matrix/client/v3/register (false: closed;
                                   # `roomstream register` still creates users)
    public_baseurl: null           # the URL clients reach the Client-Server API at,
                                   # served as GET /.well-known/matrix/client's
                                   # m.homeserver.base_url (null: this instance's own
                                   # listener, http://127.0.0.1:8008/ by default)
    allow_guest_access: false      # POST /register?kind=guest makes guest accounts
                                   # (docs/client_api.md, "Guest access")
    run_views_job: false           # `roomstream run` also runs the views streaming job
                                   # (the directory endpoints' data); `make run` does
    http:                          # limits of every HTTP listener, per connection
      header_timeout: 10           # seconds from a request's first byte to its last header
      body_timeout: 30             # seconds from the headers to the last byte of the body
      idle_timeout: 75             # seconds a connection may wait with no request
      max_connections_per_address: 256   # more from one address are closed at once
                                   # (behind a reverse proxy: its connections count)
      upload_timeout: 300          # the same for uploads (/_matrix/media/.../upload)
    media:                         # the media repository (docs/operations.md, "Media")
      store_path: null             # null: <data_dir>/media_store
      backend: local               # where files go (only local disk so far)
      max_upload_size: 50M         # bytes (K, M, G suffixes); larger: 413 M_TOO_LARGE
      max_image_pixels: 32M        # images above it are not thumbnailed (413)
      user_quota: null             # bytes one user may upload per user_quota_period
      user_quota_period: 86400     # seconds (a rolling window)
      max_pending_uploads: 5       # media IDs created and not yet uploaded, per user
      unused_expiration_time: 86400  # seconds a created media ID waits for its upload
      sweep_interval: 3600         # seconds between orphan sweeps (null: none): expired
                                   # reservations and blobs no row names are removed
      orphan_grace: 3600           # content put this recently is never swept
      enable_authenticated_media: true  # media uploaded with it on is not served by the
                                   # legacy unauthenticated /_matrix/media/v3 downloads
    caches:                        # entries each process keeps in memory (its memory
      events: 20000                # levels off once they are full: ~2.5 KB per event,
      formatted_events: 20000      # ~0.5 KB per formatted one)
      sizes: {}                    # any other cache by name (roomstream.lru.CACHES,
                                   # docs/operations.md), e.g. {room_summaries: 50000}
    presence:                      # Synapse's presence timeouts, in seconds
      enabled: true
      idle_timeout: 300            # online with no activity this long: unavailable
      sync_timeout: 30             # not syncing nor active this long: offline
      last_active_granularity: 60  # currently_active this long after activity
      process_expiry: 300          # a silent process's syncing users time out after this
    federation:                    # the Server-Server API (docs/federation.md, "Transport")
      port: null                   # the TLS federation listener (null: none)
      instance: main               # the instance that runs it
      bind_host: 127.0.0.1         # where it listens (loopback unless set)
      tls_certificate_path: null   # PEM; required with port (`roomstream gen-cert`)
      tls_private_key_path: null
      verify_certificates: true    # check other servers' TLS certificates
      ca_certificates_path: null   # PEM bundle trusted besides the system's (tests, dev)
      ip_range_blacklist: [...]    # addresses never connected to (Synapse's default list:
                                   # loopback, private, link-local...); [] allows all
      trusted_key_servers: []      # notaries: [{server_name: x, verify_keys: {id: key}}]
      request_timeout: 60          # seconds for one outbound request
      key_validity_period: 3600    # seconds our /_matrix/key/v2/server answer is valid for
      old_signing_keys: {}         # retired keys: {KEY_ID: {key: BASE64, expired_ts: MS}}
      rate_limit_per_second: 50    # requests per origin server, on average
      rate_limit_burst: 200        # and at once; more: 429 M_LIMIT_EXCEEDED
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints
from urllib.parse import urlsplit

import yaml

from roomstream.lru import CACHES
from roomstream.storage import DatabaseConfig
from roomstream.streams.registry import STREAMS

DEFAULT_CONFIG_PATHS = ("roomstream.yaml", "config/roomstream.yaml")


class ConfigError(ValueError):
    """The configuration is invalid: one line per mistake, each naming its key and why."""

    def __init__(self, problems: str | list[str]) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


@dataclass(frozen=True)
class InstanceConfig:
    host: str = "127.0.0.1"
    replication_port: int | None = None
    #: The Matrix Client-Server API's listener (nothing internal is served there).
    http_port: int | None = None
    #: The internal HTTP API's listener (``/_roomstream/replication``, ``/metrics``).
    internal_port: int | None = None


@dataclass(frozen=True)
class ReplicationConfig:
    transport: Literal["tcp", "redis"] = "tcp"
    shared_secret: str | None = None
    #: Seconds without a command before a peer that has pinged is dropped.
    ping_timeout: float = 15.0
    #: Lines queued for one connection before it is dropped for congestion.
    max_outbound_lines: int = 10_000
    #: Bytes queued in the process for one TCP connection before it is dropped.
    max_outbound_bytes: int = 8 * 1024 * 1024


@dataclass(frozen=True)
class HttpConfig:
    """What one connection to an HTTP listener may cost (roomstream.listener)."""

    #: Seconds from a request's first byte until its request line and headers are complete.
    header_timeout: float = 10.0
    #: Seconds from the end of a request's headers until the last byte of its body.
    body_timeout: float = 30.0
    #: Seconds a connection may stay open with no request in flight (keep-alive).
    idle_timeout: float = 75.0
    #: Open connections one client address may hold; further ones are closed at once.
    max_connections_per_address: int = 256
    #: ``body_timeout`` for media uploads (paths under ``/_matrix/media/``): their
    #: bodies are streamed to disk and may be large.
    upload_timeout: float = 300.0


#: Byte-size suffixes accepted in the media section (powers of 1024, as Synapse).
_SIZE_SUFFIXES = {"K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


@dataclass(frozen=True)
class MediaConfig:
    """The media repository (:mod:`roomstream.media`). Sizes are bytes (the file may
    write them with a K/M/G suffix); times are seconds."""

    #: Where the files go; None: ``<data_dir>/media_store`` (:meth:`Config.media_store`).
    store_path: str | None = None
    #: The blob store: local disk (an object store would be another value here).
    backend: Literal["local"] = "local"
    max_upload_size: int = 50 * 1024**2
    #: Images of more pixels are not thumbnailed (decompression bombs).
    max_image_pixels: int = 32 * 1024**2
    #: Bytes one user may upload per ``user_quota_period``; None: no quota.
    user_quota: int | None = None
    user_quota_period: float = 86400.0
    #: Media IDs one user may hold created and not yet uploaded to.
    max_pending_uploads: int = 5
    #: How long a created media ID may wait for its upload (then the sweep deletes it).
    unused_expiration_time: float = 86400.0
    #: Seconds between two orphan sweeps (MediaRepository.sweep); None: no sweep.
    sweep_interval: float | None = 3600.0
    #: Content put this recently is never swept (an upload commits its row well within).
    orphan_grace: float = 3600.0
    #: Media uploaded while this is on is served only by the authenticated endpoints.
    enable_authenticated_media: bool = True


@dataclass(frozen=True)
class CachesConfig:
    """How many entries each process's caches keep (least recently used first out). A
    process's memory levels off once they are full. ``events`` and ``formatted_events``
    (the big ones) have keys of their own; ``sizes`` sets any cache by its name in
    :data:`roomstream.lru.CACHES`."""

    #: Parsed events (roomstream.rooms.store.EventStore).
    events: int = 20_000
    #: Events in the client format (roomstream.reading.RoomReader).
    formatted_events: int = 20_000
    #: Cache name -> entries (see docs/operations.md for the names); for ``events`` and
    #: ``formatted_events`` the same as their own keys.
    sizes: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class PresenceConfig:
    """Presence (roomstream.client.presence): Synapse's timeouts, in seconds."""

    #: Track presence at all (false: nothing is tracked, everyone reads as offline).
    enabled: bool = True
    #: An online device with no activity for this long becomes unavailable.
    idle_timeout: float = 300.0
    #: A device neither syncing nor active for this long is gone (no device: offline).
    sync_timeout: float = 30.0
    #: A user counts as currently active this long after their last activity.
    last_active_granularity: float = 60.0
    #: A process that syncs users and says nothing for this long is taken for dead.
    process_expiry: float = 300.0


#: Addresses never connected to by federation unless configured otherwise (Synapse's
#: ``DEFAULT_IP_RANGE_BLOCKLIST``); ``0.0.0.0`` and ``::`` are refused whatever is set.
DEFAULT_IP_RANGE_BLACKLIST: tuple[str, ...] = (
    "127.0.0.0/8",
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "192.0.0.0/24",
    "169.254.0.0/16",
    "192.88.99.0/24",
    "198.18.0.0/15",
    "192.0.2.0/24",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "224.0.0.0/4",
    "::1/128",
    "fe80::/10",
    "fc00::/7",
    "2001:db8::/32",
    "ff00::/8",
    "fec0::/10",
)


@dataclass(frozen=True)
class TrustedKeyServer:
    """A notary asked for other servers' keys (``POST /_matrix/key/v2/query``)."""

    server_name: str
    #: Key ID -> unpadded base64 ed25519 key; the notary's answers must carry a
    #: signature by one of them. Empty: its answers are taken on the TLS connection's
    #: word (each server's own self-signature is still checked).
    verify_keys: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class FederationConfig:
    """The Server-Server API (:mod:`roomstream.federation`): its listener and how this
    server reaches and trusts others."""

    #: The TLS federation listener's port; None: no federation listener.
    port: int | None = None
    #: The instance that runs the federation listener.
    instance: str = "main"
    bind_host: str = "127.0.0.1"
    tls_certificate_path: str | None = None
    tls_private_key_path: str | None = None
    #: Verify other servers' certificates (off only for development).
    verify_certificates: bool = True
    #: A PEM bundle of CA certificates trusted besides the system's.
    ca_certificates_path: str | None = None
    #: Networks (CIDR or single addresses) outbound requests never connect to.
    ip_range_blacklist: tuple[str, ...] = DEFAULT_IP_RANGE_BLACKLIST
    trusted_key_servers: tuple[TrustedKeyServer, ...] = ()
    #: Seconds one outbound request may take (connection and answer).
    request_timeout: float = 60.0
    #: Seconds ahead our own key answer's ``valid_until_ts`` lies.
    key_validity_period: float = 3600.0
    #: Requests one origin may make per second on average (authenticated requests)...
    rate_limit_per_second: float = 50.0
    #: ... and at once (a token bucket's size); more are 429 M_LIMIT_EXCEEDED.
    rate_limit_burst: int = 200
    #: Keys this server signed with before (Synapse's ``old_signing_keys``): key ID ->
    #: ``{key: <base64 verify key>, expired_ts: <ms>}``, served in ``old_verify_keys``.
    old_signing_keys: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class FederationSenderConfig:
    """The federation sender (roomstream.federation.sender)."""

    #: Multiplies Synapse's destination back-off (10 minutes, doubling, up to 7 days).
    retry_interval_scale: float = 1.0


@dataclass(frozen=True)
class RedisConfig:
    host: str = "127.0.0.1"
    port: int = 6379
    db: int = 0


@dataclass(frozen=True)
class Config:
    server_name: str = "localhost"
    instance_name: str = "main"
    data_dir: str = "data"
    database: DatabaseConfig = field(default_factory=DatabaseConfig)
    stream_writers: dict[str, tuple[str, ...]] = field(default_factory=dict)
    instances: dict[str, InstanceConfig] = field(default_factory=dict)
    replication: ReplicationConfig = field(default_factory=ReplicationConfig)
    redis: RedisConfig = field(default_factory=RedisConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    caches: CachesConfig = field(default_factory=CachesConfig)
    media: MediaConfig = field(default_factory=MediaConfig)
    presence: PresenceConfig = field(default_factory=PresenceConfig)
    federation: FederationConfig = field(default_factory=FederationConfig)
    enable_registration: bool = True
    #: The Client-Server API's public base URL (``http(s)://host[:port][/path]/``, always
    #: with a trailing slash); None: this instance's own client listener.
    public_baseurl: str | None = None
    #: Guests may register (``POST /register?kind=guest``) and use the guest endpoints.
    allow_guest_access: bool = False
    #: `roomstream run` also runs the views streaming job (one process of a deployment
    #: should: they share the view tables); `--views` / `--no-views` override it.
    run_views_job: bool = False
    #: The instances that send to other homeservers; each destination is sent to by one
    #: of them (a stable hash of its name: roomstream.federation.sender.sender_for).
    federation_sender_instances: tuple[str, ...] = ("main",)
    federation_sender: FederationSenderConfig = field(default_factory=FederationSenderConfig)

    def client_base_url(self) -> str:
        """The Client-Server API's base URL as clients should use it (with a trailing
        slash): ``public_baseurl``, or else this instance's own client listener."""
        if self.public_baseurl is not None:
            return self.public_baseurl
        me = self.instance()
        host = "127.0.0.1" if me.host in ("0.0.0.0", "::") else me.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{me.http_port or 8008}/"

    def writers_of(self, stream_name: str) -> tuple[str, ...]:
        """The configured writers of a stream; the main instance if none are named."""
        return self.stream_writers.get(stream_name) or ("main",)

    def instance(self, name: str | None = None) -> InstanceConfig:
        return self.instances.get(name or self.instance_name, InstanceConfig())

    def media_store(self) -> str:
        """The media store's directory: ``media.store_path``, or under ``data_dir``."""
        return self.media.store_path or os.path.join(self.data_dir, "media_store")

    def with_instance(self, instance_name: str) -> Config:
        return replace(self, instance_name=instance_name)


def _type_problem(value: Any, hint: Any) -> str | None:
    """Why ``value`` does not fit the annotation ``hint`` (None if it does)."""
    if hint is Any:
        return None
    origin, args = get_origin(hint), get_args(hint)
    if origin is Literal:
        return None if value in args else "must be one of " + ", ".join(map(repr, args))
    if origin in (Union, UnionType):
        if value is None and type(None) in args:
            return None
        (hint,) = [a for a in args if a is not type(None)]
        origin = get_origin(hint)
    if origin is dict:
        return None if isinstance(value, dict) else "must be a mapping"
    if hint is bool:
        return None if isinstance(value, bool) else "must be true or false"
    if hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        return None if ok else f"must be an integer, not {value!r}"
    if hint is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return None if ok else f"must be a number, not {value!r}"
    if hint is str:
        return None if isinstance(value, str) else f"must be a string, not {value!r}"
    return None


def _cache_size_problems(caches: CachesConfig, raw: Any) -> list[str]:
    problems = []
    for name, size in caches.sizes.items():
        if name not in CACHES:
            problems.append(
                f"caches.sizes: no cache called {name!r} (known: {', '.join(sorted(CACHES))})"
            )
        elif not isinstance(size, int) or isinstance(size, bool) or size < 1:
            problems.append(f"caches.sizes.{name} must be a whole number above 0, not {size!r}")
        elif isinstance(raw, dict) and name in raw:
            problems.append(f"caches.{name} and caches.sizes.{name} both set: keep one")
    return problems


def _section(cls: type, raw: Any, where: str, problems: list[str]) -> Any:
    """Build the dataclass ``cls`` from ``raw``, type-checking every key; a key in error
    is reported in ``problems`` and left at its default."""
    if raw is None:
        return cls()
    if not isinstance(raw, dict):
        problems.append(f"{where} must be a mapping")
        return cls()
    hints = get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    unknown = set(raw) - known
    if unknown:
        problems.append(f"unknown keys in {where}: {', '.join(sorted(map(str, unknown)))}")
    good: dict[str, Any] = {}
    for key in known & set(raw):
        value = raw[key]
        problem = _type_problem(value, hints[key])
        if problem is None:
            problem = _range_problem(key, value)
        if problem is None:
            good[key] = value
        else:
            problems.append(f"{where}.{key} {problem}")
    return cls(**good)


#: Numeric keys that must be above zero.
_POSITIVE = frozenset(
    {
        "pool_min",
        "pool_max",
        "sqlite_cache_mb",
        "ping_timeout",
        "max_outbound_lines",
        "header_timeout",
        "body_timeout",
        "idle_timeout",
        "max_connections_per_address",
        "events",
        "formatted_events",
        "upload_timeout",
        "max_upload_size",
        "max_image_pixels",
        "user_quota",
        "user_quota_period",
        "unused_expiration_time",
        "sweep_interval",
        "orphan_grace",
        "max_pending_uploads",
        "sync_timeout",
        "last_active_granularity",
        "process_expiry",
        "request_timeout",
        "key_validity_period",
        "rate_limit_per_second",
        "rate_limit_burst",
        "retry_interval_scale",
    }
)


def _media_section(raw: Any, problems: list[str]) -> MediaConfig:
    """The ``media`` section; sizes may be written ``50M`` (:data:`_SIZE_SUFFIXES`)."""
    if isinstance(raw, dict):
        raw = dict(raw)
        for key in ("max_upload_size", "max_image_pixels", "user_quota"):
            value = raw.get(key)
            if isinstance(value, str):
                size = _parse_size(value)
                if size is None:
                    problems.append(
                        f"media.{key} must be a number of bytes (e.g. 50M), not {value!r}"
                    )
                    del raw[key]
                else:
                    raw[key] = size
    media: MediaConfig = _section(MediaConfig, raw, "media", problems)
    if media.store_path is not None:
        problem = _path_problem(media.store_path, directory=True)
        if problem:
            problems.append(f"media.store_path: {problem}")
    return media


def _parse_size(text: str) -> int | None:
    text = text.strip().upper()
    factor = _SIZE_SUFFIXES.get(text[-1:], 1)
    digits = text[:-1] if text[-1:] in _SIZE_SUFFIXES else text
    if not digits.isascii() or not digits.isdigit():
        return None
    return int(digits) * factor


def _range_problem(key: str, value: Any) -> str | None:
    """Why a well-typed ``value`` is out of range for ``key`` (None if it is not)."""
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if key.endswith("port") and not 1 <= value <= 65535:
        return f"must be a port number in 1..65535, not {value}"
    if key in _POSITIVE and value <= 0:
        return f"must be positive, not {value}"
    return None


def _path_problem(path: str, *, directory: bool) -> str | None:
    """Why ``path`` cannot be used as a directory (or a file) roomstream creates if missing."""
    target = Path(path)
    if target.exists():
        if directory and not target.is_dir():
            return f"{path} exists and is not a directory"
        if not directory and target.is_dir():
            return f"{path} is a directory, not a file"
        return None
    parent = target.parent if not directory else target
    while not parent.exists():
        if parent == parent.parent:
            break
        parent = parent.parent
    if not parent.is_dir():
        return f"{path} cannot be created: {parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{path} cannot be created: {parent} is not writable"
    return None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_config(raw: dict[str, Any] | None, base_dir: Path | None = None) -> Config:
    """Check and build the configuration; every mistake is one line of the ConfigError."""
    raw = dict(raw or {})
    problems: list[str] = []
    known = {f.name for f in fields(Config)}
    unknown = set(raw) - known
    if unknown:
        problems.append(f"unknown top-level keys: {', '.join(sorted(map(str, unknown)))}")
    for key in ("server_name", "instance_name", "data_dir"):
        if key in raw and not isinstance(raw[key], str):
            problems.append(f"{key} must be a string, not {raw[key]!r}")
    data_dir = raw.get("data_dir", "data")
    data_dir = data_dir if isinstance(data_dir, str) else "data"
    if base_dir is not None and not os.path.isabs(data_dir):
        data_dir = str(base_dir / data_dir)
    database_raw = raw.get("database") or {}
    if isinstance(database_raw, dict):
        database_raw = dict(database_raw)
        database_raw.setdefault("path", os.path.join(data_dir, "roomstream.db"))
    database = _section(DatabaseConfig, database_raw, "database", problems)
    if database.pool_min > database.pool_max:
        problems.append(
            f"database.pool_min ({database.pool_min}) exceeds database.pool_max"
            f" ({database.pool_max})"
        )
    writers = _stream_writers(raw.get("stream_writers"), problems)
    instances_raw = raw.get("instances")
    instances: dict[str, InstanceConfig] = {}
    if instances_raw is not None and not isinstance(instances_raw, dict):
        problems.append("instances must be a mapping of instance name to its listeners")
    for name, spec in (instances_raw or {}).items() if isinstance(instances_raw, dict) else ():
        instances[str(name)] = _section(InstanceConfig, spec, f"instances.{name}", problems)
    if "instances" not in raw:
        # One process, no file: main listens on loopback so `nc 127.0.0.1 9092` works.
        instances = {
            "main": InstanceConfig(replication_port=9092, http_port=8008, internal_port=9093)
        }
    replication = _section(ReplicationConfig, raw.get("replication"), "replication", problems)
    redis = _section(RedisConfig, raw.get("redis"), "redis", problems)
    http = _section(HttpConfig, raw.get("http"), "http", problems)
    caches = _section(CachesConfig, raw.get("caches"), "caches", problems)
    media = _media_section(raw.get("media"), problems)
    problems.extend(_cache_size_problems(caches, raw.get("caches") or {}))
    presence = _section(PresenceConfig, raw.get("presence"), "presence", problems)
    federation = _federation_section(raw.get("federation"), problems)
    enable_registration = raw.get("enable_registration", True)
    if not isinstance(enable_registration, bool):
        problems.append(f"enable_registration must be true or false, not {enable_registration!r}")
        enable_registration = True
    run_views_job = raw.get("run_views_job", False)
    if not isinstance(run_views_job, bool):
        problems.append(f"run_views_job must be true or false, not {run_views_job!r}")
        run_views_job = False
    allow_guest_access = raw.get("allow_guest_access", False)
    if not isinstance(allow_guest_access, bool):
        problems.append(f"allow_guest_access must be true or false, not {allow_guest_access!r}")
        allow_guest_access = False
    public_baseurl = _public_baseurl(raw.get("public_baseurl"), problems)
    federation_sender_instances = _federation_sender_instances(
        raw.get("federation_sender_instances"), instances, problems
    )
    federation_sender = _section(
        FederationSenderConfig, raw.get("federation_sender"), "federation_sender", problems
    )
    config = Config(
        enable_registration=enable_registration,
        allow_guest_access=allow_guest_access,
        public_baseurl=public_baseurl,
        run_views_job=run_views_job,
        server_name=str(raw.get("server_name", "localhost")),
        instance_name=str(raw.get("instance_name", "main")),
        data_dir=data_dir,
        database=database,
        stream_writers=writers,
        instances=instances,
        replication=replication,
        redis=redis,
        http=http,
        caches=caches,
        media=media,
        presence=presence,
        federation=federation,
        federation_sender_instances=federation_sender_instances,
        federation_sender=federation_sender,
    )
    data_dir_problem = _path_problem(data_dir, directory=True)
    if data_dir_problem and isinstance(raw.get("data_dir", "data"), str):
        problems.append(f"data_dir: {data_dir_problem}")
    path_given = isinstance(raw.get("database"), dict) and "path" in raw["database"]
    # A path derived from a bad data_dir is the same mistake: report it once.
    if (
        database.engine == "sqlite"
        and database.path != ":memory:"
        and (path_given or not data_dir_problem)
    ):
        problem = _path_problem(database.path, directory=False)
        if problem:
            problems.append(f"database.path: {problem}")
    for stream, names in writers.items():
        for name in names:
            if name not in instances:
                problems.append(
                    f"stream_writers.{stream} names {name!r}, which is not among instances"
                    f" ({', '.join(sorted(instances)) or 'none'})"
                )
    for single in ("presence", "pushers", "push_rules"):
        if len(writers.get(single, ())) > 1:
            problems.append(
                f"stream_writers.{single} must name one instance: {single} has a single writer"
            )
    problems.extend(_listener_problems(instances, replication))
    if federation.port is not None and federation.instance not in instances:
        problems.append(
            f"federation.instance names {federation.instance!r}, which is not among instances"
            f" ({', '.join(sorted(instances)) or 'none'})"
        )
    if problems:
        raise ConfigError(problems)
    return config


def _federation_section(raw: Any, problems: list[str]) -> FederationConfig:
    """The ``federation`` section: its lists checked here, the rest by :func:`_section`;
    with a ``port``, the certificate and key files must be given and readable."""
    if not isinstance(raw, dict):
        return _section(FederationConfig, raw, "federation", problems)  # type: ignore[no-any-return]
    raw = dict(raw)
    lists: dict[str, Any] = {}
    blacklist_raw = raw.pop("ip_range_blacklist", None)
    if blacklist_raw is not None:
        if not isinstance(blacklist_raw, list):
            problems.append("federation.ip_range_blacklist must be a list of CIDR ranges")
        else:
            good = []
            for entry in blacklist_raw:
                try:
                    ipaddress.ip_network(str(entry), strict=False)
                except ValueError:
                    problems.append(
                        f"federation.ip_range_blacklist: {entry!r} is not an IP range"
                        " (e.g. 10.0.0.0/8, ::1/128)"
                    )
                else:
                    good.append(str(entry))
            lists["ip_range_blacklist"] = tuple(good)
    servers_raw = raw.pop("trusted_key_servers", None)
    if servers_raw is not None:
        lists["trusted_key_servers"] = tuple(_trusted_key_servers(servers_raw, problems))
    federation: FederationConfig = replace(
        _section(FederationConfig, raw, "federation", problems), **lists
    )
    if federation.port is not None:
        for key in ("tls_certificate_path", "tls_private_key_path"):
            path = getattr(federation, key)
            if path is None:
                problems.append(
                    f"federation.{key} is required with federation.port"
                    " (`roomstream gen-cert` makes a self-signed pair for development)"
                )
            elif not os.access(path, os.R_OK) or os.path.isdir(path):
                problems.append(f"federation.{key}: {path} is not a readable file")
    for kid, old in federation.old_signing_keys.items():
        if (
            not isinstance(old, dict)
            or set(old) != {"key", "expired_ts"}
            or not isinstance(old["key"], str)
            or not isinstance(old["expired_ts"], int)
            or not str(kid).startswith("ed25519:")
        ):
            problems.append(
                f"federation.old_signing_keys.{kid} must be"
                " {key: BASE64_VERIFY_KEY, expired_ts: MILLISECONDS} under an ed25519: key ID"
            )
    ca = federation.ca_certificates_path
    if ca is not None and (not os.access(ca, os.R_OK) or os.path.isdir(ca)):
        problems.append(f"federation.ca_certificates_path: {ca} is not a readable file")
    return federation


def _trusted_key_servers(raw: Any, problems: list[str]) -> list[TrustedKeyServer]:
    shape = "a list of {server_name: NAME, verify_keys: {KEY_ID: BASE64_KEY}}"
    if not isinstance(raw, list):
        problems.append(f"federation.trusted_key_servers must be {shape}")
        return []
    servers = []
    for i, entry in enumerate(raw):
        where = f"federation.trusted_key_servers[{i}]"
        name = entry.get("server_name") if isinstance(entry, dict) else None
        keys = entry.get("verify_keys", {}) if isinstance(entry, dict) else None
        if (
            not isinstance(name, str)
            or not isinstance(keys, dict)
            or set(entry) - {"server_name", "verify_keys"}
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in keys.items())
        ):
            problems.append(f"{where} must be {{server_name: NAME, verify_keys: {{KEY_ID: KEY}}}}")
            continue
        servers.append(TrustedKeyServer(name, dict(keys)))
    return servers


def _public_baseurl(raw: Any, problems: list[str]) -> str | None:
    """``public_baseurl`` with a trailing slash (as Synapse keeps it), or None; a value
    that is not an absolute http(s) URL with a host (and no query or fragment) is one
    problem line."""
    if raw is None:
        return None
    why = "must be an http:// or https:// URL with a host, such as https://matrix.example.org/"
    if not isinstance(raw, str):
        problems.append(f"public_baseurl {why}, not {raw!r}")
        return None
    try:
        parts = urlsplit(raw)
        parts.port  # noqa: B018 - raises ValueError for a port out of range or not a number
    except ValueError:
        parts = None
    if (
        parts is None
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.query
        or parts.fragment
        or parts.username is not None
        or any(c.isspace() for c in raw)
    ):
        problems.append(f"public_baseurl {why}, not {raw!r}")
        return None
    return raw if raw.endswith("/") else raw + "/"


def _stream_writers(raw: Any, problems: list[str]) -> dict[str, tuple[str, ...]]:
    writers: dict[str, tuple[str, ...]] = {}
    if raw is None:
        return writers
    if not isinstance(raw, dict):
        problems.append("stream_writers must be a mapping of stream name to instance names")
        return writers
    for stream, names in raw.items():
        if stream not in STREAMS:
            problems.append(f"stream_writers names an unknown stream {stream!r}")
            continue
        if isinstance(names, str):
            names = [names]
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            problems.append(f"stream_writers.{stream} must be a non-empty list of names")
            continue
        writers[stream] = tuple(names)
    return writers


def _federation_sender_instances(
    raw: Any, instances: dict[str, InstanceConfig], problems: list[str]
) -> tuple[str, ...]:
    """``federation_sender_instances``: a non-empty list of distinct instance names (one
    name alone may be written as a string); the default is the main process."""
    if raw is None:
        return ("main",)
    names = [raw] if isinstance(raw, str) else raw
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        problems.append(
            f"federation_sender_instances must be a non-empty list of instance names, not {raw!r}"
        )
        return ("main",)
    if len(set(names)) != len(names):
        problems.append(f"federation_sender_instances names an instance twice: {names!r}")
        return ("main",)
    unknown = [n for n in names if n not in instances]
    if unknown:
        problems.append(
            f"federation_sender_instances names {', '.join(map(repr, unknown))}, which"
            f" {'is' if len(unknown) == 1 else 'are'} not among instances"
            f" ({', '.join(sorted(instances)) or 'none'})"
        )
        return ("main",)
    return tuple(names)


def _listener_problems(
    instances: dict[str, InstanceConfig], replication: ReplicationConfig
) -> list[str]:
    problems = []
    taken: dict[tuple[str, int], str] = {}
    for name, instance in instances.items():
        if not is_loopback(instance.host) and not replication.shared_secret:
            problems.append(
                f"instances.{name}.host is {instance.host}, beyond loopback: "
                "set replication.shared_secret (the generated one is local to this machine)"
            )
        for key in ("replication_port", "http_port", "internal_port"):
            port = getattr(instance, key)
            if port is None:
                continue
            here = f"instances.{name}.{key}"
            other = taken.setdefault((instance.host, port), here)
            if other != here:
                problems.append(f"{here}: port {port} on {instance.host} is also {other}")
    return problems


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    """Load the configuration from ``path``, ``$ROOMSTREAM_CONFIG``, or a default location.

    With no file anywhere, the defaults apply: one process, SQLite under ``./data``.
    """
    candidate = path or os.environ.get("ROOMSTREAM_CONFIG")
    if candidate is None:
        candidate = next((p for p in DEFAULT_CONFIG_PATHS if os.path.exists(p)), None)
    if candidate is None:
        return parse_config({})
    file = Path(candidate)
    try:
        raw = yaml.safe_load(file.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read configuration {file}: {exc}") from exc
    if raw is not None and not isinstance(raw, dict):
        raise ConfigError(f"{file}: the top level must be a mapping")
    return parse_config(raw)
