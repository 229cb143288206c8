"""The federation sender's configuration keys: ``federation_sender_instances`` and the
``federation_sender`` section (each mistake one line, as in tests/test_config.py)."""

from __future__ import annotations

import re

import pytest

from roomstream.config import ConfigError, parse_config

TWO: dict[str, object] = {"instances": {"main": {}, "fed1": {}, "fed2": {}}}


def test_default_is_the_main_process() -> None:
    config = parse_config({})
    assert config.federation_sender_instances == ("main",)
    assert config.federation_sender.retry_interval_scale == 1.0


def test_sharded_senders_and_scale() -> None:
    config = parse_config(
        {
            **TWO,
            "federation_sender_instances": ["fed1", "fed2"],
            "federation_sender": {"retry_interval_scale": 0.001},
        }
    )
    assert config.federation_sender_instances == ("fed1", "fed2")
    assert config.federation_sender.retry_interval_scale == 0.001
    assert parse_config(
        {**TWO, "federation_sender_instances": "fed2"}
    ).federation_sender_instances == ("fed2",)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {**TWO, "federation_sender_instances": ["fed1", "fed9"]},
            r"^federation_sender_instances names 'fed9', which is not among instances"
            r" \(fed1, fed2, main\)$",
        ),
        (
            {**TWO, "federation_sender_instances": []},
            r"^federation_sender_instances must be a non-empty list of instance names, not \[\]$",
        ),
        (
            {**TWO, "federation_sender_instances": ["fed1", "fed1"]},
            r"^federation_sender_instances names an instance twice",
        ),
        (
            {"federation_sender": {"retry_interval_scale": 0}},
            r"^federation_sender.retry_interval_scale must be positive, not 0$",
        ),
        (
            {"federation_sender": {"retry_interval_scale": "fast"}},
            r"^federation_sender.retry_interval_scale must be a number",
        ),
        (
            {"federation_sender": {"retry_scale": 2}},
            r"^unknown keys in federation_sender: retry_scale$",
        ),
    ],
)
def test_mistakes_are_one_line_each(raw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert len(info.value.problems) == 1, info.value.problems
    assert re.search(message, info.value.problems[0]), info.value.problems[0]
