"""Stream change caches: never a false "no", bounded size, monotonic horizon."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from roomstream.streams import StreamChangeCache


def test_answers_from_recorded_changes() -> None:
    cache = StreamChangeCache("room_changes", current_position=10)
    cache.entity_has_changed("!a", 12)
    cache.entity_has_changed("!b", 15)
    assert cache.has_entity_changed("!a", 11)
    assert not cache.has_entity_changed("!a", 12)
    assert not cache.has_entity_changed("!c", 10)
    assert cache.has_entity_changed("!c", 9)  # before the horizon: unknown
    assert cache.get_entities_changed({"!a", "!b", "!c"}, 13) == {"!b"}
    assert cache.get_all_entities_changed(10) == ["!a", "!b"]
    assert cache.get_all_entities_changed(9) is None
    assert cache.has_any_entity_changed(14) and not cache.has_any_entity_changed(15)
    assert cache.get_max_position_of_entity("!b") == 15
    assert cache.get_max_position_of_entity("!zzz") == 10


def test_eviction_raises_horizon() -> None:
    cache = StreamChangeCache("c", current_position=0, max_size=2)
    cache.entity_has_changed("a", 1)
    cache.entity_has_changed("b", 2)
    cache.entity_has_changed("c", 3)
    assert len(cache) == 2
    assert cache.horizon == 1
    assert cache.has_entity_changed("a", 0)  # forgotten, so "maybe"
    assert not cache.has_entity_changed("a", 1)  # a changed at 1, not after


@given(
    changes=st.lists(st.tuples(st.sampled_from("abcdefgh"), st.integers(1, 100)), max_size=80),
    max_size=st.integers(1, 6),
    query=st.integers(0, 100),
)
def test_never_a_false_no(changes: list[tuple[str, int]], max_size: int, query: int) -> None:
    cache = StreamChangeCache("c", current_position=0, max_size=max_size)
    last: dict[str, int] = {}
    horizons = [cache.horizon]
    for entity, position in changes:
        cache.entity_has_changed(entity, position)
        last[entity] = max(last.get(entity, 0), position)
        horizons.append(cache.horizon)
        assert len(cache) <= max_size
    assert horizons == sorted(horizons)
    for entity in "abcdefgh":
        truly_changed = last.get(entity, 0) > query
        if truly_changed:
            assert cache.has_entity_changed(entity, query)
    everything = cache.get_all_entities_changed(query)
    if everything is not None:
        assert set(everything) == {e for e, p in last.items() if p > query}
