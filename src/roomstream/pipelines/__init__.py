"""Bulk work on Spark: a streaming source over roomstream's streams, exactly-once sinks,
and derived views (room / user statistics, user directory). See ``docs/pipelines.md``.

- :mod:`~roomstream.pipelines.source`: ``spark.readStream.format("roomstream")``.
- :mod:`~roomstream.pipelines.sinks`: database sink (exactly-once by batch id), Parquet.
- :mod:`~roomstream.pipelines.views`: the views' streaming job and their rebuild job.
- :mod:`~roomstream.pipelines.session`: SparkSessions (local or a cluster's master URL).
- :mod:`~roomstream.pipelines.cluster`: a loopback Spark standalone cluster (tests, demos).

Importing a name from this package imports its module (and PySpark); nothing here starts
a JVM until called.
"""

from __future__ import annotations

import importlib
from typing import Any

# Names resolve on first use (PEP 562): Spark's Python workers import
# ``roomstream.pipelines.source`` in a fresh interpreter that Spark allows a fixed 10 s to
# connect back, so the package must not drag in the sinks, views and session modules.
_HOMES = {
    "spark_session": "session",
    "DatabaseSink": "sinks",
    "forget_sink": "sinks",
    "start_parquet_stream": "sinks",
    "SOURCE_NAME": "source",
    "RoomstreamDataSource": "source",
    "register": "source",
    "ContentLookup": "views",
    "EventJsonContentLookup": "views",
    "MappingContentLookup": "views",
    "ViewSnapshot": "views",
    "ViewsSink": "views",
    "read_snapshot": "views",
    "rebuild_views": "views",
    "rebuild_views_cli": "views",
    "run_views": "views",
    "start_views_query": "views",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)


__all__ = [
    "SOURCE_NAME",
    "ContentLookup",
    "DatabaseSink",
    "EventJsonContentLookup",
    "MappingContentLookup",
    "RoomstreamDataSource",
    "ViewSnapshot",
    "ViewsSink",
    "forget_sink",
    "read_snapshot",
    "rebuild_views",
    "rebuild_views_cli",
    "register",
    "run_views",
    "spark_session",
    "start_parquet_stream",
    "start_views_query",
]
