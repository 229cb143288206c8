"""Jobs in their own processes: the driver killed between the sink's commit and Spark's,
then restarted (both engines); and the same job on a standalone cluster (master URL only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from roomstream.pipelines.cluster import standalone_cluster
from roomstream.pipelines.views import MappingContentLookup, read_snapshot, rebuild_views
from roomstream.storage import Database, DatabaseConfig, connect, prepare_database
from tests.pipelines.job import CRASH_EXIT
from tests.support.pipelines import (
    contents_txn,
    create_delivered_txn,
    delivered_txn,
    events_generator,
    expected_txn,
    member,
    message,
    write_events,
)
from tests.support.pipelines_scenario import Scenario

# Each test starts JVMs of its own (a driver; a master and a worker): slow on a busy machine,
# so the bounds are hang backstops only (a job took minutes at load 30 on 2 cores).
pytestmark = [pytest.mark.spark, pytest.mark.timeout(1800)]
JOB_TIMEOUT = 800
ROOT = Path(__file__).resolve().parents[2]


def run_job(
    config: DatabaseConfig, mode: str, checkpoint: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "tests.pipelines.job", mode, "--engine", config.engine,
            "--checkpoint", str(checkpoint)]  # fmt: skip
    if config.engine == "sqlite":
        args += ["--path", config.path]
    else:
        args += ["--dsn", config.dsn] + (["--schema", config.schema] if config.schema else [])
    return subprocess.run(
        [*args, *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT,
        env=dict(os.environ),
    )


def sink_report(proc: subprocess.CompletedProcess[str]) -> dict[str, list[int]]:
    assert proc.returncode == 0, proc.stderr[-4000:]
    report: dict[str, list[int]] = json.loads(proc.stdout.strip().splitlines()[-1])
    return report


async def test_driver_killed_after_sink_commit_then_restarted(
    db_config: DatabaseConfig, database: Database, tmp_path: Path
) -> None:
    await database.run_interaction("create_delivered", create_delivered_txn)
    gen = await events_generator(database, "w", ["w"])
    await write_events(
        database, gen, [member("!r", "@a", "join")] + [message("!r", "@a") for _ in range(8)]
    )
    checkpoint = tmp_path / "ckpt"
    crashed = run_job(db_config, "facts", checkpoint, "--crash-after-batch", "1")
    assert crashed.returncode == CRASH_EXIT, crashed.stderr[-4000:]
    # Batch 1 is in the sink (its bookkeeping row committed with the data)...
    assert {t for _, t, _ in await database.run_interaction("delivered", delivered_txn)} == set(
        range(1, 6)
    )  # batches 0-1: tokens 1-2, 3-5
    # ...and Spark replays it on restart: the sink recognises it and writes nothing twice.
    report = sink_report(run_job(db_config, "facts", checkpoint))
    assert report["skipped"] == [1]
    assert report["applied"] and min(report["applied"]) == 2
    delivered = await database.run_interaction("delivered", delivered_txn)
    assert delivered == await database.run_interaction("expected", expected_txn, ["w"])


async def test_views_job_on_a_standalone_cluster(spark: SparkSession, tmp_path: Path) -> None:
    config = DatabaseConfig(engine="sqlite", path=str(tmp_path / "cluster.db"))
    database = connect(config)
    try:
        await prepare_database(database)
        scenario = Scenario(database)
        await scenario.setup()
        for i in range(Scenario.STEPS):
            await scenario.step(i)
        contents = await database.run_interaction("contents", contents_txn)
    finally:
        await database.close()
    with standalone_cluster(tmp_path / "cluster", cores=2, memory="1g", timeout=600) as master:
        report = sink_report(run_job(config, "views", tmp_path / "ckpt", "--master", master))
    assert report["applied"]
    rebuilt = rebuild_views(spark, config, lookup=MappingContentLookup(contents), write=False)
    streamed = read_snapshot(config)
    assert streamed == rebuilt.snapshot
    assert streamed.directory == {"@alice": "Alice in priv", "@zed": "Zed"}
