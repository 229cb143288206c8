"""The ``http`` section of the configuration: the listener's per-connection limits."""

from __future__ import annotations

import pytest

from roomstream.config import ConfigError, HttpConfig, parse_config


def test_http_limits_default_and_parse() -> None:
    assert parse_config({}).http == HttpConfig()
    raw = {
        "http": {
            "header_timeout": 2,
            "body_timeout": 3.5,
            "idle_timeout": 40,
            "max_connections_per_address": 9,
        }
    }
    assert parse_config(raw).http == HttpConfig(2, 3.5, 40, 9)


@pytest.mark.parametrize(
    ("section", "line"),
    [
        ({"header_timeout": 0}, "http.header_timeout must be positive, not 0"),
        ({"body_timeout": -1}, "http.body_timeout must be positive, not -1"),
        ({"idle_timeout": "long"}, "http.idle_timeout must be a number, not 'long'"),
        (
            {"max_connections_per_address": 1.5},
            "http.max_connections_per_address must be an integer, not 1.5",
        ),
        ({"header_timeout": 1, "slow": 2}, "unknown keys in http: slow"),
    ],
)
def test_bad_http_limits_are_one_line_each(section: dict[str, object], line: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config({"http": section})
    assert raised.value.problems == [line]


def test_cache_sizes_default_and_parse() -> None:
    from roomstream.config import CachesConfig

    assert parse_config({}).caches == CachesConfig(20_000, 20_000)
    assert parse_config({"caches": {"events": 5}}).caches == CachesConfig(5, 20_000)
    with pytest.raises(ConfigError) as raised:
        parse_config({"caches": {"formatted_events": 0}})
    assert raised.value.problems == ["caches.formatted_events must be positive, not 0"]
