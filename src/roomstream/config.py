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
      main: {replication_port: 9092, http_port: 8008}   # 127.0.0.1:9092 and :8008)
    replication:
      transport: tcp               # or redis
      shared_secret: null          # required when a listener binds beyond loopback
    redis: {host: 127.0.0.1, port: 6379}
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

import yaml

from roomstream.storage import DatabaseConfig
from roomstream.streams.registry import STREAMS

DEFAULT_CONFIG_PATHS = ("roomstream.yaml", "config/roomstream.yaml")


class ConfigError(ValueError):
    """The configuration is invalid; the message says which key and why."""


@dataclass(frozen=True)
class InstanceConfig:
    host: str = "127.0.0.1"
    replication_port: int | None = None
    http_port: int | None = None


@dataclass(frozen=True)
class ReplicationConfig:
    transport: Literal["tcp", "redis"] = "tcp"
    shared_secret: str | None = None
    #: Seconds without a command before a peer that has pinged is dropped.
    ping_timeout: float = 15.0
    #: Lines queued for one connection before it is dropped for congestion.
    max_outbound_lines: int = 10_000


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

    def writers_of(self, stream_name: str) -> tuple[str, ...]:
        """The configured writers of a stream; the main instance if none are named."""
        return self.stream_writers.get(stream_name) or ("main",)

    def instance(self, name: str | None = None) -> InstanceConfig:
        return self.instances.get(name or self.instance_name, InstanceConfig())

    def with_instance(self, instance_name: str) -> Config:
        return replace(self, instance_name=instance_name)


def _section(cls: type, raw: Any, where: str) -> Any:
    if raw is None:
        return cls()
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a mapping")
    known = {f.name for f in fields(cls)}
    unknown = set(raw) - known
    if unknown:
        raise ConfigError(f"unknown keys in {where}: {', '.join(sorted(unknown))}")
    return cls(**raw)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_config(raw: dict[str, Any] | None, base_dir: Path | None = None) -> Config:
    raw = dict(raw or {})
    known = {f.name for f in fields(Config)}
    unknown = set(raw) - known
    if unknown:
        raise ConfigError(f"unknown top-level keys: {', '.join(sorted(unknown))}")
    data_dir = str(raw.get("data_dir", "data"))
    if base_dir is not None and not os.path.isabs(data_dir):
        data_dir = str(base_dir / data_dir)
    database_raw = dict(raw.get("database") or {})
    database_raw.setdefault("path", os.path.join(data_dir, "roomstream.db"))
    database = _section(DatabaseConfig, database_raw, "database")
    if database.engine not in ("sqlite", "postgres"):
        raise ConfigError("database.engine must be 'sqlite' or 'postgres'")
    writers: dict[str, tuple[str, ...]] = {}
    for stream, names in (raw.get("stream_writers") or {}).items():
        if stream not in STREAMS:
            raise ConfigError(f"stream_writers names an unknown stream {stream!r}")
        if isinstance(names, str):
            names = [names]
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise ConfigError(f"stream_writers.{stream} must be a non-empty list of names")
        writers[stream] = tuple(names)
    instances = {
        str(name): _section(InstanceConfig, spec, f"instances.{name}")
        for name, spec in (raw.get("instances") or {}).items()
    }
    if "instances" not in raw:
        # One process, no file: main listens on loopback so `nc 127.0.0.1 9092` works.
        instances = {"main": InstanceConfig(replication_port=9092, http_port=8008)}
    replication = _section(ReplicationConfig, raw.get("replication"), "replication")
    if replication.transport not in ("tcp", "redis"):
        raise ConfigError("replication.transport must be 'tcp' or 'redis'")
    config = Config(
        server_name=str(raw.get("server_name", "localhost")),
        instance_name=str(raw.get("instance_name", "main")),
        data_dir=data_dir,
        database=database,
        stream_writers=writers,
        instances=instances,
        replication=replication,
        redis=_section(RedisConfig, raw.get("redis"), "redis"),
    )
    for name, instance in instances.items():
        if not is_loopback(instance.host) and not replication.shared_secret:
            raise ConfigError(
                f"instances.{name}.host is {instance.host}, beyond loopback: "
                "set replication.shared_secret to protect internal endpoints"
            )
    return config


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
