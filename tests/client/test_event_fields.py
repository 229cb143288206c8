"""``event_fields`` projection: the same answer as projecting path by path (the naive
definition), at a cost bounded by the event's size whatever the number of paths (a
filter of thousands of paths made every /sync event cost thousands of lookups)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from roomstream.client.filtering import field_trie, parse_sync_filter, project_fields
from tests.support.client import q, room_with
from tests.support.homeserver import Homeserver

KEYS = st.sampled_from(["a", "b", "c", "content", "body"])
values = st.recursive(
    st.integers(0, 3) | st.none(),
    lambda children: st.dictionaries(KEYS, children, max_size=4),
    max_leaves=12,
)
paths = st.lists(st.lists(KEYS, min_size=1, max_size=4).map(tuple), max_size=6)


def naive_project(event: Mapping[str, Any], field_paths: list[tuple[str, ...]]) -> Any:
    """Each path on its own; a path that is a prefix of another takes the whole value."""
    result: dict[str, Any] = {}
    covered = [p for p in field_paths if not any(p[: len(o)] == o and o != p for o in field_paths)]
    for path in covered:
        source: Any = event
        for key in path:
            if not isinstance(source, Mapping) or key not in source:
                break
            source = source[key]
        else:
            target = result
            for key in path[:-1]:
                target = target.setdefault(key, {})
            target[path[-1]] = source
    return result


@given(st.dictionaries(KEYS, values, max_size=5), paths)
def test_projection_is_the_naive_definition(event: dict[str, Any], field_paths: Any) -> None:
    assert project_fields(event, field_paths) == naive_project(event, field_paths)


class CountingEvent(Mapping[str, Any]):
    """A mapping that counts the lookups made in it (and in its nested objects)."""

    def __init__(self, data: Mapping[str, Any], counter: list[int]) -> None:
        self.data = {
            k: CountingEvent(v, counter) if isinstance(v, Mapping) else v for k, v in data.items()
        }
        self.counter = counter

    def __getitem__(self, key: str) -> Any:
        self.counter[0] += 1
        return self.data[key]

    def __contains__(self, key: object) -> bool:
        self.counter[0] += 1
        return key in self.data

    def __iter__(self) -> Iterator[str]:
        self.counter[0] += len(self.data)
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)


def test_cost_is_bounded_by_the_event_not_the_paths() -> None:
    event_data = {"type": "m.room.message", "content": {"body": "x", "k7": 1}, "sender": "@a:b"}
    many = [("content", f"k{i}") for i in range(20_000)] + [("type",)]
    counter = [0]
    projected = project_fields(CountingEvent(event_data, counter), field_trie(many))
    assert projected == {"type": "m.room.message", "content": {"k7": 1}}
    assert counter[0] <= 4 * 6  # a few lookups per key of the event


async def test_thousands_of_event_fields_through_sync(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    room_id = await room_with(homeserver, alice)
    await homeserver.ok(
        "PUT",
        f"/rooms/{room_id}/send/org.example.x/{homeserver.txn()}",
        {"k3": 1, "other": 2},
        token=alice.token,
    )
    definition = {
        "event_fields": ["type"] + [f"content.k{i}" for i in range(4000)],
        "room": {"timeline": {"types": ["org.example.x"]}},
    }
    filter_id = (
        await homeserver.ok("POST", f"/user/{alice.user_id}/filter", definition, token=alice.token)
    )["filter_id"]
    assert parse_sync_filter(definition).event_fields is not None
    body = await homeserver.ok("GET", f"/sync?filter={filter_id}", token=alice.token)
    assert body["rooms"]["join"][room_id]["timeline"]["events"] == [
        {"type": "org.example.x", "content": {"k3": 1}}
    ]
    inline = {"event_fields": ["content"], "room": {"timeline": {"types": ["org.example.x"]}}}
    body = await homeserver.ok("GET", f"/sync?filter={q(inline)}", token=alice.token)
    assert body["rooms"]["join"][room_id]["timeline"]["events"] == [
        {"content": {"k3": 1, "other": 2}}
    ]
