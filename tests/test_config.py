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
        "instances: {writer1: {replication_port: 9100}, writer2: {}, main: {}}\n"
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
        ({"instances": {"w": {"http_port": "8008"}}}, r"instances.w.http_port must be an integer"),
        ({"instances": {"w": {"http_port": 70000}}}, r"instances.w.http_port must be a port .*"),
        ({"instances": {"w": {"replication_port": 0}}}, r"replication_port must be a port"),
        ({"instances": {"w": {"replication_port": True}}}, r"replication_port must be an integer"),
        ({"redis": {"port": -1}}, r"redis.port must be a port number in 1..65535, not -1"),
        ({"replication": {"ping_timeout": "soon"}}, r"replication.ping_timeout must be a number"),
        ({"replication": {"max_outbound_lines": 0}}, r"max_outbound_lines must be positive"),
        ({"database": {"pool_max": "8"}}, r"database.pool_max must be an integer"),
        ({"database": {"pool_min": 9, "pool_max": 8}}, r"pool_min \(9\) exceeds"),
        ({"database": {"sqlite_cache_mb": 0}}, r"database.sqlite_cache_mb must be positive, not 0"),
        ({"server_name": 42}, r"server_name must be a string"),
        ({"instances": ["main"]}, r"instances must be a mapping"),
        (
            {"stream_writers": {"events": ["w1", "w9"]}, "instances": {"w1": {}}},
            r"stream_writers.events names 'w9', which is not among instances \(w1\)",
        ),
        (
            {"stream_writers": {"push_rules": ["w1", "w2"]}, "instances": {"w1": {}, "w2": {}}},
            r"stream_writers.push_rules must name one instance: push_rules has a single writer",
        ),
        (
            {"instances": {"a": {"http_port": 9000}, "b": {"replication_port": 9000}}},
            r"instances.b.replication_port: port 9000 on 127.0.0.1 is also instances.a.http_port",
        ),
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


def test_paths_are_checked(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(ConfigError, match=r"^data_dir: .*afile exists and is not a directory$"):
        parse_config({"data_dir": str(afile)})
    with pytest.raises(ConfigError, match=r"database.path: .*afile is not a directory"):
        parse_config({"database": {"path": str(afile / "x" / "roomstream.db")}})
    with pytest.raises(ConfigError, match=r"database.path: .* is a directory, not a file"):
        parse_config({"database": {"path": str(tmp_path)}})
    # Directories that do not exist yet are fine: roomstream creates them.
    config = parse_config({"data_dir": str(tmp_path / "new" / "data")})
    assert config.database.path == str(tmp_path / "new" / "data" / "roomstream.db")


def test_every_mistake_is_one_line() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(
            {
                "instances": {"w1": {"http_port": "x", "replication_port": 99999}},
                "stream_writers": {"events": ["w2"]},
                "redis": {"port": "6379"},
            }
        )
    assert sorted(info.value.problems) == [
        "instances.w1.http_port must be an integer, not 'x'",
        "instances.w1.replication_port must be a port number in 1..65535, not 99999",
        "redis.port must be an integer, not '6379'",
        "stream_writers.events names 'w2', which is not among instances (w1)",
    ]
    assert str(info.value).count("\n") == 3


def test_media_section(tmp_path: Path) -> None:
    config = parse_config({"data_dir": str(tmp_path)})
    assert config.media_store() == str(tmp_path / "media_store")
    assert (config.media.max_upload_size, config.media.max_image_pixels) == (50 << 20, 32 << 20)
    assert config.media.user_quota is None and config.media.enable_authenticated_media
    config = parse_config(
        {
            "media": {
                "store_path": str(tmp_path / "files"),
                "max_upload_size": "10M",
                "max_image_pixels": 1000,
                "user_quota": "2g",
                "user_quota_period": 60,
                "enable_authenticated_media": False,
            }
        }
    )
    assert config.media_store() == str(tmp_path / "files")
    assert (config.media.max_upload_size, config.media.max_image_pixels) == (10 << 20, 1000)
    assert (config.media.user_quota, config.media.user_quota_period) == (2 << 30, 60)
    assert not config.media.enable_authenticated_media
    # The orphan sweep: hourly by default, null turns it off; the grace must be positive.
    assert (config.media.sweep_interval, config.media.orphan_grace) == (3600, 3600)
    swept = parse_config({"media": {"sweep_interval": None, "orphan_grace": 60}}).media
    assert (swept.sweep_interval, swept.orphan_grace) == (None, 60)
    with pytest.raises(ConfigError) as info:
        parse_config({"media": {"sweep_interval": 0, "orphan_grace": -1}})
    assert sorted(info.value.problems) == [
        "media.orphan_grace must be positive, not -1",
        "media.sweep_interval must be positive, not 0",
    ]
    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(ConfigError) as info:
        parse_config(
            {
                "media": {
                    "store_path": str(afile),
                    "max_upload_size": "lots",
                    "max_image_pixels": 0,
                    "user_quota": True,
                    "backend": "s3",
                    "colour": "red",
                }
            }
        )
    assert sorted(info.value.problems) == [
        "media.backend must be one of 'local'",
        "media.max_image_pixels must be positive, not 0",
        "media.max_upload_size must be a number of bytes (e.g. 50M), not 'lots'",
        f"media.store_path: {afile} exists and is not a directory",
        "media.user_quota must be an integer, not True",
        "unknown keys in media: colour",
    ]
