"""Building SparkSessions for roomstream jobs: the same code on ``local[N]`` and on a cluster.

Only the master URL differs between a laptop and a standalone cluster: the session always
ships the PostgreSQL JDBC driver (Debian's jar; no Maven downloads), tells Python workers
to use this interpreter (which has roomstream installed) and registers the source.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

from roomstream.pipelines.source import register

#: Where ``scripts/system-deps.sh`` (Debian's libpostgresql-jdbc-java) puts the driver.
POSTGRES_JDBC_JAR = os.environ.get("ROOMSTREAM_JDBC_JAR", "/usr/share/java/postgresql.jar")


def spark_session(
    master: str = "local[2]",
    app_name: str = "roomstream",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Get or create the process's SparkSession for ``master``, with the source registered.

    Invariant: Python workers (planner and executors) run ``sys.executable``, so they import
    the same roomstream as the driver.
    """
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.pyspark.driver.python", sys.executable)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.streaming.stopTimeout", "30s")
    )
    if os.path.exists(POSTGRES_JDBC_JAR):
        builder = builder.config("spark.jars", POSTGRES_JDBC_JAR)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark
