"""A pipelines job run in its own process (driver crash tests, the cluster test).

    python -m tests.pipelines.job MODE --engine sqlite --path DB --checkpoint DIR
        [--master URL] [--crash-after-batch N]

MODE ``facts`` copies the events stream into the ``delivered`` table with the exactly-once
database sink (``maxRowsPerBatch`` 3, trigger availableNow); ``views`` runs the views job
(availableNow). ``--crash-after-batch N`` ends the process with ``os._exit`` right after
batch N's sink transaction committed, before Spark writes the batch's commit log entry.
Prints one JSON line with the batches the sink applied and skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from roomstream.pipelines.session import spark_session
from roomstream.pipelines.sinks import DatabaseSink
from roomstream.pipelines.views import EventJsonContentLookup, ViewsSink, start_views_query
from roomstream.storage import DatabaseConfig

CRASH_EXIT = 17


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["facts", "views"])
    parser.add_argument("--engine", default="sqlite")
    parser.add_argument("--path", default="")
    parser.add_argument("--dsn", default="")
    parser.add_argument("--schema", default=None)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--crash-after-batch", type=int, default=None)
    args = parser.parse_args()
    config = (
        DatabaseConfig(engine="sqlite", path=args.path)
        if args.engine == "sqlite"
        else DatabaseConfig(engine="postgres", dsn=args.dsn, schema=args.schema, pool_min=1)
    )

    def after_commit(batch_id: int) -> None:
        if args.crash_after_batch is not None and batch_id == args.crash_after_batch:
            sys.stdout.flush()
            os._exit(CRASH_EXIT)  # the driver dies: no commit log entry for this batch

    spark = spark_session(args.master, app_name=f"roomstream-job-{args.mode}")
    sink: DatabaseSink[object]
    if args.mode == "views":
        sink = ViewsSink(config, lookup=EventJsonContentLookup(), after_commit=after_commit)  # type: ignore[assignment]
        query, _ = start_views_query(
            spark,
            config,
            args.checkpoint,
            sink=sink,
            available_now=True,  # type: ignore[arg-type]
        )
    else:
        from pathlib import Path

        from tests.support.pipelines import facts_sink, start_facts_query

        sink = facts_sink(config, "facts", after_commit=after_commit)  # type: ignore[assignment]
        query = start_facts_query(spark, config, Path(args.checkpoint), sink, maxRowsPerBatch="3")
    try:
        if args.mode == "facts":
            query.processAllAvailable()
        else:
            query.awaitTermination()
    finally:
        query.stop()
        sink.close()
    print(json.dumps({"applied": sink.applied, "skipped": sink.skipped}))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
