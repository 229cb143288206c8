"""Stream change caches: which entities changed at which stream position.

A hot path asks "may room R (or user U) have changed since position p?" before touching the
database. The cache remembers the last position each entity changed at, for a bounded
number of entities. Everything before its *horizon* (the start position, raised as old
entries are evicted) is unknown, so questions about older positions answer "maybe".
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from sortedcontainers import SortedDict


class StreamChangeCache:
    """Last change position per entity, bounded in size.

    Invariants: every entity that changed after ``horizon`` has its latest change recorded
    (so a "no" is always true); ``horizon`` never decreases; at most ``max_size`` entities
    are held.
    """

    def __init__(self, name: str, current_position: int, max_size: int = 10_000) -> None:
        if max_size < 1:
            raise ValueError("max_size must be at least 1")
        self.name = name
        self.max_size = max_size
        self._horizon = current_position
        self._entity_to_position: dict[str, int] = {}
        self._position_to_entities: SortedDict = SortedDict()

    @property
    def horizon(self) -> int:
        """Changes at or before this position are not known individually."""
        return self._horizon

    def __len__(self) -> int:
        return len(self._entity_to_position)

    def entity_has_changed(self, entity: str, position: int) -> None:
        """Record that ``entity`` changed at ``position``."""
        if position <= self._horizon:
            return  # already covered by "maybe"
        old = self._entity_to_position.get(entity)
        if old is not None:
            if old >= position:
                return
            entities = self._position_to_entities[old]
            entities.discard(entity)
            if not entities:
                del self._position_to_entities[old]
        self._entity_to_position[entity] = position
        self._position_to_entities.setdefault(position, set()).add(entity)
        while len(self._entity_to_position) > self.max_size:
            evicted_position, evicted = self._position_to_entities.popitem(0)
            for e in evicted:
                del self._entity_to_position[e]
            self._horizon = max(self._horizon, evicted_position)

    def has_entity_changed(self, entity: str, position: int) -> bool:
        """May ``entity`` have changed after ``position``? False only when certainly not."""
        if position < self._horizon:
            return True
        last = self._entity_to_position.get(entity)
        return last is not None and last > position

    def get_entities_changed(self, entities: Collection[str], position: int) -> set[str]:
        """The subset of ``entities`` that may have changed after ``position``."""
        if position < self._horizon:
            return set(entities)
        changed = self.get_all_entities_changed(position)
        assert changed is not None
        if len(changed) < len(entities):
            return {e for e in changed if e in entities}
        return {e for e in entities if self.has_entity_changed(e, position)}

    def has_any_entity_changed(self, position: int) -> bool:
        if position < self._horizon:
            return True
        return (
            bool(self._position_to_entities)
            and self._position_to_entities.peekitem(-1)[0] > position
        )

    def get_all_entities_changed(self, position: int) -> list[str] | None:
        """Every entity changed after ``position``, oldest change first; None if unknown."""
        if position < self._horizon:
            return None
        result: list[str] = []
        index = self._position_to_entities.bisect_right(position)
        for pos in self._position_to_entities.islice(index):
            result.extend(sorted(self._position_to_entities[pos]))
        return result

    def get_max_position_of_entity(self, entity: str) -> int:
        """The last known change of ``entity``, or the horizon if none is known."""
        return self._entity_to_position.get(entity, self._horizon)

    def prefill(self, changes: Iterable[tuple[str, int]]) -> None:
        for entity, position in changes:
            self.entity_has_changed(entity, position)
