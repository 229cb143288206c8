"""Every Prometheus metric roomstream exports, in one place (``docs/operations.md``).

Two kinds:

- process-wide instruments updated by small hooks where things happen: persisting events
  (:func:`observe_persisted`, :func:`persist_timer`) and HTTP requests
  (:func:`roomstream.httpbase.http_metrics_middleware`). They live in
  ``prometheus_client``'s default registry, next to its ``process_*`` and ``python_*``
  metrics;
- the caches' figures (:mod:`roomstream.lru`), read at scrape time from the live caches
  by a collector in the default registry (:func:`set_cache_source`);
- per-instance gauges read at scrape time from the running instance (stream positions,
  replication connections and lag) by a :class:`InstanceCollector`, so nothing on the hot
  path keeps them up to date.

``render`` produces the text the ``/metrics`` route serves.

Label values are bounded: streams, writers and room versions come from fixed sets or the
configuration, HTTP routes are the route *templates* (``/rooms/{room_id}/send_event``,
never a room ID), and requests no route matched share the route label ``unmatched``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = [
    "CONTENT_TYPE_LATEST",
    "EVENTS_PERSISTED",
    "HTTP_REQUESTS",
    "PERSIST_SECONDS",
    "TRANSACTION_RETRIES",
    "TRANSACTION_SECONDS",
    "CacheFigures",
    "InstanceCollector",
    "InstanceSnapshot",
    "observe_persisted",
    "persist_timer",
    "render",
    "set_cache_source",
]

PERSIST_SECONDS = Histogram(
    "roomstream_persist_seconds",
    "Time to persist one batch of events, from the call to its commit.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
TRANSACTION_SECONDS = Histogram(
    "roomstream_db_transaction_seconds",
    "Time of one database transaction by name (the name given to run_interaction), from"
    " taking a connection to the commit or the rollback, retries included.",
    ["name"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
TRANSACTION_RETRIES = Counter(
    "roomstream_db_transaction_retries",
    "Transactions run again after a serialization failure or a deadlock, by name.",
    ["name"],
)
EVENTS_PERSISTED = Counter(
    "roomstream_events_persisted",
    "Events persisted, by room version and outcome (accepted, rejected, soft_failed).",
    ["room_version", "outcome"],
)
HTTP_REQUESTS = Counter(
    "roomstream_http_requests",
    "HTTP requests answered, by method, route template and status code.",
    ["method", "route", "status"],
)


def observe_persisted(room_version: str, rejected: bool, soft_failed: bool) -> None:
    """Count one newly stored event."""
    outcome = "rejected" if rejected else "soft_failed" if soft_failed else "accepted"
    EVENTS_PERSISTED.labels(room_version, outcome).inc()


@dataclass
class InstanceSnapshot:
    """What an instance reports at one scrape."""

    instance: str
    #: stream -> writer -> the last position known of that writer (its ID generator's)
    positions: dict[str, dict[str, int]] = field(default_factory=dict)
    #: stream -> linear position (every fact at or below it is processed)
    linear: dict[str, int] = field(default_factory=dict)
    #: transport link kind ("server", "client", "redis") -> open connections
    connections: dict[str, int] = field(default_factory=dict)
    #: (stream, writer) -> (stream IDs behind the writer's announcements, seconds behind)
    lag: dict[tuple[str, str], tuple[int, float]] = field(default_factory=dict)


class SnapshotSource(Protocol):
    def metrics_snapshot(self) -> InstanceSnapshot: ...


class InstanceCollector(Collector):
    """Gauges read from a running instance at each scrape."""

    def __init__(self, source: SnapshotSource) -> None:
        self._source = source

    def collect(self) -> Iterable[Metric]:
        snap = self._source.metrics_snapshot()
        yield from _instance_metrics(snap)


def _instance_metrics(snap: InstanceSnapshot) -> Iterator[Metric]:
    labels = ["instance", "stream", "writer"]
    position = GaugeMetricFamily(
        "roomstream_stream_position",
        "Each writer's position of each stream, as this instance knows it.",
        labels=labels,
    )
    for stream, writers in sorted(snap.positions.items()):
        for writer, token in sorted(writers.items()):
            position.add_metric([snap.instance, stream, writer], token)
    yield position
    yield _keyed_gauge(
        "roomstream_stream_linear_position",
        "Each stream's linear position: every fact at or below it is processed here.",
        snap.instance,
        "stream",
        snap.linear,
    )
    yield _keyed_gauge(
        "roomstream_replication_connections",
        "Open replication links: server (readers connected here), client (to writers),"
        " redis (subscriptions).",
        snap.instance,
        "kind",
        snap.connections,
    )
    facts = GaugeMetricFamily(
        "roomstream_replication_lag_facts",
        "Stream IDs between the last one a writer announced and the last processed here.",
        labels=labels,
    )
    seconds = GaugeMetricFamily(
        "roomstream_replication_lag_seconds",
        "How long the oldest announced but unprocessed fact has waited (0 when caught up).",
        labels=labels,
    )
    for (stream, writer), (behind, waited) in sorted(snap.lag.items()):
        facts.add_metric([snap.instance, stream, writer], behind)
        seconds.add_metric([snap.instance, stream, writer], waited)
    yield facts
    yield seconds


def _keyed_gauge(
    name: str, documentation: str, instance: str, key_label: str, values: Mapping[str, int]
) -> GaugeMetricFamily:
    """One gauge a key of ``values`` (labelled ``instance`` and ``key_label``), in key order."""
    family = GaugeMetricFamily(name, documentation, labels=["instance", key_label])
    for key, value in sorted(values.items()):
        family.add_metric([instance, key], value)
    return family


@dataclass
class CacheFigures:
    """One cache name's figures at a scrape (sums over its live caches)."""

    name: str
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    invalidations: int = 0
    entries: int = 0
    max_size: int = 0


class _CacheCollector(Collector):
    def __init__(self) -> None:
        self.source: Callable[[], Iterable[CacheFigures]] = list

    def collect(self) -> Iterable[Metric]:
        counters = {
            "hits": "Reads of a cache that found the key.",
            "misses": "Reads of a cache that did not find the key.",
            "evictions": "Entries dropped from a cache to keep it within its size.",
            "invalidations": "Entries dropped from a cache because their data changed.",
        }
        figures = list(self.source())
        for kind, documentation in counters.items():
            family = CounterMetricFamily(f"roomstream_cache_{kind}", documentation, labels=["name"])
            for f in figures:
                family.add_metric([f.name], getattr(f, kind))
            yield family
        entries = GaugeMetricFamily(
            "roomstream_cache_entries", "Entries in a cache now.", labels=["name"]
        )
        sizes = GaugeMetricFamily(
            "roomstream_cache_max_size",
            "The most entries a cache keeps (caches.sizes in the configuration).",
            labels=["name"],
        )
        for f in figures:
            entries.add_metric([f.name], f.entries)
            sizes.add_metric([f.name], f.max_size)
        yield entries
        yield sizes


_CACHES = _CacheCollector()
REGISTRY.register(_CACHES)


def set_cache_source(source: Callable[[], Iterable[CacheFigures]]) -> None:
    """Where the cache collector reads its figures (:mod:`roomstream.lru` sets it)."""
    _CACHES.source = source


def render(instance: CollectorRegistry | None = None) -> bytes:
    """The exposition text: the process-wide metrics, then the instance's."""
    text = generate_latest(REGISTRY)
    if instance is not None:
        text += generate_latest(instance)
    return text


def instance_registry(source: SnapshotSource) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(InstanceCollector(source))
    return registry


def persist_timer(started: float) -> Callable[[asyncio.Future[Any]], None]:
    """A done-callback for a persist future: observes the time from ``started``
    (``time.perf_counter()`` when persisting began) to the commit, if it committed."""

    def done(future: asyncio.Future[Any]) -> None:
        if not future.cancelled() and future.exception() is None:
            PERSIST_SECONDS.observe(time.perf_counter() - started)

    return done
