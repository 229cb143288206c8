"""Configuration: defaults with no file, validation with clear messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from roomstream.config import ConfigError, load_config, parse_config


def test_defaults_work_with_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ROOMSTREAM_CONFIG", raising=False)
    config = load_config()
    assert config.database.engine == "sqlite"
    assert config.database.path.endswith("data/roomstream.db")
    assert config.instance_name == "main"
    assert config.writers_of("events") == ("main",)


def test_full_file(tmp_path: Path) -> None:
    path = tmp_path / "roomstream.yaml"
    path.write_text(
        "server_name: example.org\n"
        "instance_name: writer1\n"
        "database: {engine: postgres, dsn: 'postgresql://postgres@127.0.0.1/x'}\n"
        "stream_writers: {events: [writer1, writer2], typing: main}\n"
        "instances: {writer1: {replication_port: 9100}}\n"
        "replication: {transport: redis}\n"
    )
    config = load_config(path)
    assert config.server_name == "example.org"
    assert config.database.engine == "postgres"
    assert config.writers_of("events") == ("writer1", "writer2")
    assert config.writers_of("typing") == ("main",)
    assert config.instance("writer1").replication_port == 9100
    assert config.replication.transport == "redis"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"bogus": 1}, "unknown top-level keys: bogus"),
        ({"database": {"engine": "mysql"}}, "database.engine"),
        ({"stream_writers": {"nope": ["a"]}}, "unknown stream 'nope'"),
        ({"stream_writers": {"events": []}}, "non-empty list"),
        ({"replication": {"transport": "carrier-pigeon"}}, "replication.transport"),
        ({"instances": {"w": {"host": "0.0.0.0"}}}, "shared_secret"),
        ({"instances": {"w": {"colour": "red"}}}, "unknown keys in instances.w"),
    ],
)
def test_invalid_configuration_is_explained(raw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(raw)


def test_non_loopback_listener_allowed_with_secret() -> None:
    config = parse_config(
        {"instances": {"w": {"host": "0.0.0.0"}}, "replication": {"shared_secret": "s3cret"}}
    )
    assert config.instance("w").host == "0.0.0.0"
