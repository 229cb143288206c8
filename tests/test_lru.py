"""roomstream.lru: the one cache type, checked against a naive model, its sizes from the
configuration and its figures in the metrics."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from roomstream import lru
from roomstream.config import ConfigError, parse_config
from roomstream.lru import CACHES, LruCache, configure_sizes


@pytest.fixture(autouse=True)
def default_sizes() -> Iterator[None]:
    yield
    configure_sizes({})


def test_evicts_least_recently_used() -> None:
    cache: LruCache[tuple[str], int] = LruCache("c", max_size=2, prefix_index=True)
    cache.set(("a",), 1)
    cache.set(("b",), 2)
    assert cache.get(("a",)) == 1  # a is now the most recent
    cache.set(("c",), 3)
    assert ("b",) not in cache and cache.keys() == [("a",), ("c",)]
    assert (cache.hits, cache.misses, cache.evictions) == (1, 0, 1)
    assert cache.get(("b",)) is None and cache.misses == 1
    assert cache.peek(("a",)) == 1 and cache.keys() == [("a",), ("c",)]  # order untouched
    assert (cache.hits, cache.misses) == (1, 1)  # peek counts nothing
    with pytest.raises(TypeError):
        cache.set("not-a-tuple", 1)  # type: ignore[arg-type]


def test_invalidate_key_prefix_and_all() -> None:
    cache: LruCache[tuple[str, str], int] = LruCache("c", 10, prefix_index=True)
    cache.set(("!r", "@a"), 1)
    cache.set(("!r", "@b"), 2)
    cache.set(("!s", "@a"), 3)
    assert cache.invalidate(("!r", "@a")) == 1
    assert cache.keys() == [("!r", "@b"), ("!s", "@a")]
    assert cache.invalidate(("!r",)) == 1  # prefix
    assert cache.keys() == [("!s", "@a")]
    assert cache.invalidate(("!nothing",)) == 0
    assert cache.invalidate_all() == 1 and len(cache) == 0
    assert cache.invalidations == 3
    plain: LruCache[str, int] = LruCache("p", 10)
    with pytest.raises(TypeError, match="no prefix index"):
        plain.invalidate(("x",))


operations = st.lists(
    st.tuples(
        st.sampled_from(["get", "peek", "set", "pop", "invalidate", "resize"]),
        st.sampled_from(["a", "b", "c", "d", "e"]),
        st.sampled_from(["x", "y"]),
        st.integers(min_value=1, max_value=4),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(size=st.integers(min_value=1, max_value=4), ops=operations)
def test_agrees_with_a_naive_list(size: int, ops: list[tuple[str, str, str, int]]) -> None:
    """Against a list of (key, value), least recently used first: the same contents in
    the same order, the same answers and the same counters after every operation."""
    cache: LruCache[tuple[str, str], int] = LruCache("model", size, prefix_index=True)
    model: list[tuple[tuple[str, str], int]] = []
    hits = misses = evictions = invalidations = 0
    for step, (op, first, second, number) in enumerate(ops):
        key = (first, second)
        found = [i for i, (k, _) in enumerate(model) if k == key]
        if op == "get":
            expected = model[found[0]][1] if found else None
            if found:
                model.append(model.pop(found[0]))
                hits += 1
            else:
                misses += 1
            assert cache.get(key) == expected
        elif op == "peek":
            assert cache.peek(key) == (model[found[0]][1] if found else None)
        elif op == "set":
            if found:
                model.pop(found[0])
            model.append((key, step))
            cache.set(key, step)
        elif op == "pop":
            expected = model.pop(found[0])[1] if found else None
            assert cache.pop(key) == expected
        elif op == "invalidate":
            doomed = [entry for entry in model if entry[0][0] == first]
            model = [entry for entry in model if entry[0][0] != first]
            invalidations += len(doomed)
            assert cache.invalidate((first,)) == len(doomed)
        else:
            size = number
            cache.resize(size)
        while len(model) > size:
            model.pop(0)
            evictions += 1
        assert cache.items() == model
        assert len(cache) == len(model) <= cache.max_size == size
        assert (cache.hits, cache.misses, cache.evictions, cache.invalidations) == (
            hits,
            misses,
            evictions,
            invalidations,
        )


def test_named_caches_take_their_sizes_from_the_configuration() -> None:
    before: LruCache[str, int] = LruCache("events")
    assert before.max_size == CACHES["events"].default_size
    for i in range(10):
        before.set(str(i), i)
    configure_sizes({"events": 4})
    assert before.max_size == 4 and before.keys() == ["6", "7", "8", "9"]
    assert LruCache("events").max_size == 4  # made later: the configured size too
    configure_sizes({})
    assert before.max_size == CACHES["events"].default_size
    with pytest.raises(KeyError, match="no cache called"):
        LruCache("no_such_cache")
    with pytest.raises(ValueError, match="no cache called 'evnts'"):
        configure_sizes({"evnts": 4})
    with pytest.raises(ValueError, match="whole number above 0"):
        configure_sizes({"events": 0})


def test_configuration_errors_name_the_cache() -> None:
    config = parse_config({"caches": {"sizes": {"formatted_events": 7, "events": 9}}})
    assert config.caches.sizes == {"formatted_events": 7, "events": 9}
    with pytest.raises(ConfigError, match=r"caches\.sizes: no cache called 'evnts'"):
        parse_config({"caches": {"sizes": {"evnts": 4}}})
    with pytest.raises(ConfigError, match=r"caches\.sizes\.events"):
        parse_config({"caches": {"sizes": {"events": -1}}})
    with pytest.raises(ConfigError, match=r"caches\.sizes"):
        parse_config({"caches": {"sizes": ["events"]}})


def test_figures_are_exported_by_name() -> None:
    def sample(metric: str) -> float:
        return REGISTRY.get_sample_value(metric, {"name": "metrics_probe"}) or 0.0

    cache: LruCache[str, int] = LruCache("metrics_probe", 2)
    cache.set("a", 1)
    cache.get("a")
    cache.get("b")
    cache.set("b", 2)
    cache.set("c", 3)
    assert sample("roomstream_cache_hits_total") == 1
    assert sample("roomstream_cache_misses_total") == 1
    assert sample("roomstream_cache_evictions_total") == 1
    assert sample("roomstream_cache_entries") == 2
    assert sample("roomstream_cache_max_size") == 2
    del cache
    assert "metrics_probe" not in {f.name for f in lru._figures()}


def test_no_other_module_keeps_its_own_lru() -> None:
    """Recency bookkeeping lives in roomstream.lru only. Two modules order entries for
    other reasons: the sliding sync connection store (client state dropped by idle time
    and a per-device limit, not a cache) and the stream change cache (ordered by stream
    position)."""
    import re
    from pathlib import Path

    import roomstream

    root = Path(roomstream.__file__).parent
    allowed = {"lru.py", "sliding/connections.py", "streams/change_cache.py"}
    found = [
        str(path.relative_to(root))
        for path in sorted(root.rglob("*.py"))
        if str(path.relative_to(root)) not in allowed
        and re.search(r"move_to_end\(|popitem\(|OrderedDict", path.read_text())
    ]
    assert found == []
