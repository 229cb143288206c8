"""One SparkSession for the whole pipelines test run (starting one costs seconds)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from roomstream.pipelines.session import spark_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = spark_session("local[2]", app_name="roomstream-tests")
    try:
        yield session
    finally:
        for query in session.streams.active:
            query.stop()
        session.stop()
