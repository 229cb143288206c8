"""Building SparkSessions for roomstream jobs: the same code on ``local[N]`` and on a cluster.

Only the master URL differs between a laptop and a standalone cluster: the session always
ships the PostgreSQL JDBC driver (Debian's jar; no Maven downloads), tells Python workers
to use this interpreter (which has roomstream installed) and registers the source.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import SparkSession

from roomstream.pipelines.source import register

#: Where ``scripts/system-deps.sh`` (Debian's libpostgresql-jdbc-java) puts the driver.
POSTGRES_JDBC_JAR = os.environ.get("ROOMSTREAM_JDBC_JAR", "/usr/share/java/postgresql.jar")


#: Spark's JVM logging when quiet: errors only (see :func:`spark_session`).
QUIET_LOG4J = Path(__file__).with_name("log4j2-quiet.properties")


def spark_session(
    master: str = "local[2]",
    app_name: str = "roomstream",
    conf: Mapping[str, str] | None = None,
    *,
    quiet: bool = True,
) -> SparkSession:
    """Get or create the process's SparkSession for ``master``, with the source registered.

    ``quiet`` (the default): Spark logs errors only and draws no console stage bars, so
    roomstream's own progress and summaries are what a user reads; ``quiet=False``
    (``roomstream -v``) keeps Spark's WARN logs and its stage bars.

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
    builder = builder.config("spark.ui.showConsoleProgress", "false" if quiet else "true")
    if quiet:
        builder = builder.config(
            "spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{QUIET_LOG4J}"
        )
        logging.getLogger("py4j").setLevel(logging.WARNING)
    if os.path.exists(POSTGRES_JDBC_JAR):
        builder = builder.config("spark.jars", POSTGRES_JDBC_JAR)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if quiet:
        # For a session that already existed (its JVM started without our log profile).
        spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark
