"""One SparkSession for the whole pipelines test run (starting one costs seconds); Spark
tests get a 900 s hang backstop instead of the default 300 s, since a loaded 2-core machine
makes a JVM several times slower (the 28 s views test took about 120 s at load 20)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from roomstream.pipelines.session import spark_session


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("spark") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(900))


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = spark_session("local[2]", app_name="roomstream-tests")
    try:
        yield session
    finally:
        for query in session.streams.active:
            query.stop()
        session.stop()
