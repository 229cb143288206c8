"""Bulk work on Spark: a streaming source over roomstream's streams, exactly-once sinks,
and derived views (room / user statistics, user directory). See ``docs/pipelines.md``.

- :mod:`~roomstream.pipelines.source`: ``spark.readStream.format("roomstream")``.
- :mod:`~roomstream.pipelines.sinks`: database sink (exactly-once by batch id), Parquet.
- :mod:`~roomstream.pipelines.views`: the views' streaming job and their rebuild job.
- :mod:`~roomstream.pipelines.session`: SparkSessions (local or a cluster's master URL).
- :mod:`~roomstream.pipelines.cluster`: a loopback Spark standalone cluster (tests, demos).

Importing this package imports PySpark; nothing here starts a JVM until called.
"""

from roomstream.pipelines.session import spark_session
from roomstream.pipelines.sinks import DatabaseSink, forget_sink, start_parquet_stream
from roomstream.pipelines.source import SOURCE_NAME, RoomstreamDataSource, register
from roomstream.pipelines.views import (
    ContentLookup,
    EventJsonContentLookup,
    MappingContentLookup,
    ViewSnapshot,
    ViewsSink,
    read_snapshot,
    rebuild_views,
    rebuild_views_cli,
    run_views,
    start_views_query,
)

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
