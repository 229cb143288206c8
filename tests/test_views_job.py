"""`roomstream run --views`: the views job beside the server, which survives its failure."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from roomstream.config import ConfigError, parse_config
from roomstream.homeserver import ViewsJob


async def test_a_failing_views_job_is_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    job = ViewsJob(
        [sys.executable, "-c", "import sys; print('no java'); sys.exit(3)"],
        tmp_path / "views-job.log",
    )
    with caplog.at_level(logging.WARNING, logger="roomstream.homeserver"):
        await job.start()
        assert job.process is not None
        assert await job.process.wait() == 3
        assert job._watcher is not None
        await job._watcher
        await job.stop()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "views job exited with code 3" in warnings[0].getMessage()
    assert "no java" in (tmp_path / "views-job.log").read_text()


async def test_a_views_job_that_cannot_start_is_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    job = ViewsJob([str(tmp_path / "missing-binary")], tmp_path / "views-job.log")
    with caplog.at_level(logging.WARNING, logger="roomstream.homeserver"):
        await job.start()
        await job.stop()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "views job not started" in warnings[0].getMessage()


async def test_stopping_interrupts_the_job_without_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    job = ViewsJob([sys.executable, "-c", "import time; time.sleep(600)"], tmp_path / "log")
    with caplog.at_level(logging.WARNING, logger="roomstream.homeserver"):
        await job.start()
        assert job.process is not None
        job.stop_timeout = 120.0  # SIGTERM ends it: the kill is a backstop
        await job.stop()
        assert job.process.returncode == -15
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def test_run_views_job_config_key() -> None:
    assert parse_config({}).run_views_job is False
    assert parse_config({"run_views_job": True}).run_views_job is True
    with pytest.raises(ConfigError, match="run_views_job must be true or false"):
        parse_config({"run_views_job": "yes"})
