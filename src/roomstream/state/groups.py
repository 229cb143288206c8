"""State groups stored as branches of versioned entries (see ``docs/state.md``).

A *state group* is an immutable map (type, state_key) -> event_id, identified by an integer.
Each group is a version ``(branch, seq)`` of a *branch*. A branch stores one row per change:
"key K held event E for seqs [from_seq, to_seq)". Extending a branch at its tip with a
delta inserts one row per changed key and closes the key's previous row (an update, not a
new row). Deriving from an older version starts a new branch whose *base* is that version;
reading a version takes the branch's rows alive at ``seq`` and fills the other keys from
the base, recursively.

Invariants:

- a group's state never changes once created (rows are only inserted, or closed at a seq
  above every existing version of their branch);
- one state event adds one row; only forks add a branch row, and only resolved merges
  that differ from every parent add more than one row per group;
- base chains are at most ``MAX_BRANCH_DEPTH`` long: a deeper fork starts from a full copy.

Functions here run inside a :class:`~roomstream.storage.Transaction`.
"""

from __future__ import annotations

from collections.abc import Mapping

from roomstream.events.model import StateKey
from roomstream.storage import Transaction

StateMap = dict[StateKey, str]
StateDelta = Mapping[StateKey, str | None]
"""Changes to a state map: a key mapped to None is removed."""

OPEN = 2**62  # to_seq of an entry still alive at the branch tip
MAX_BRANCH_DEPTH = 16


def _next_id(txn: Transaction, sequence: str) -> int:
    return txn.nextval_many(sequence, 1)[0]


def create_state_group_txn(
    txn: Transaction, room_id: str, parent_group: int | None, delta: StateDelta
) -> int:
    """A new group equal to ``parent_group``'s state with ``delta`` applied."""
    if parent_group is None:
        branch = _new_branch(txn, room_id, None, None, 0)
        seq = 1
        _insert_entries(txn, branch, seq, {k: v for k, v in delta.items() if v is not None})
    else:
        branch, parent_seq = _version(txn, parent_group)
        row = txn.query_one(
            "SELECT tip_seq, depth FROM state_branches WHERE branch_id = ?", (branch,)
        )
        tip_seq, depth = int(row[0]), int(row[1])
        if parent_seq == tip_seq:
            seq = tip_seq + 1
            for (etype, state_key), _ in delta.items():
                txn.execute(
                    "UPDATE state_entries SET to_seq = ? WHERE branch_id = ? AND type = ?"
                    " AND state_key = ? AND to_seq = ?",
                    (seq, branch, etype, state_key, OPEN),
                )
            _insert_entries(txn, branch, seq, delta)
            txn.execute("UPDATE state_branches SET tip_seq = ? WHERE branch_id = ?", (seq, branch))
        elif depth + 1 > MAX_BRANCH_DEPTH:
            full = get_state_txn(txn, parent_group)
            for key, value in delta.items():
                if value is None:
                    full.pop(key, None)
                else:
                    full[key] = value
            branch = _new_branch(txn, room_id, None, None, 0)
            seq = 1
            _insert_entries(txn, branch, seq, full)
        else:
            branch = _new_branch(txn, room_id, branch, parent_seq, depth + 1)
            seq = 1
            _insert_entries(txn, branch, seq, delta)
    group = _next_id(txn, "state_group_id_seq")
    txn.execute(
        "INSERT INTO state_groups (state_group, room_id, branch_id, seq) VALUES (?, ?, ?, ?)",
        (group, room_id, branch, seq),
    )
    return group


def _new_branch(
    txn: Transaction, room_id: str, base: int | None, base_seq: int | None, depth: int
) -> int:
    branch = _next_id(txn, "state_branch_id_seq")
    txn.execute(
        "INSERT INTO state_branches (branch_id, room_id, base_branch_id, base_seq, depth,"
        " tip_seq) VALUES (?, ?, ?, ?, ?, 1)",
        (branch, room_id, base, base_seq, depth),
    )
    return branch


def _insert_entries(txn: Transaction, branch: int, seq: int, delta: StateDelta) -> None:
    txn.executemany(
        "INSERT INTO state_entries (branch_id, type, state_key, event_id, from_seq, to_seq)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        [(branch, k[0], k[1], v, seq, OPEN) for k, v in delta.items()],
    )


def _version(txn: Transaction, group: int) -> tuple[int, int]:
    row = txn.query_one("SELECT branch_id, seq FROM state_groups WHERE state_group = ?", (group,))
    if row is None:
        raise LookupError(f"no state group {group}")
    return int(row[0]), int(row[1])


def _base(txn: Transaction, branch: int) -> tuple[int | None, int | None]:
    row = txn.query_one(
        "SELECT base_branch_id, base_seq FROM state_branches WHERE branch_id = ?", (branch,)
    )
    return (row[0], row[1]) if row else (None, None)


def get_state_txn(txn: Transaction, group: int) -> StateMap:
    """The full state of a group."""
    branch: int | None
    seq: int | None
    branch, seq = _version(txn, group)
    state: StateMap = {}
    shadowed: set[StateKey] = set()
    while branch is not None and seq is not None:
        rows = txn.query(
            "SELECT type, state_key, event_id FROM state_entries"
            " WHERE branch_id = ? AND to_seq > ? AND from_seq <= ?",
            (branch, seq, seq),
        )
        for etype, state_key, event_id in rows:
            key = (etype, state_key)
            if key in shadowed:
                continue
            shadowed.add(key)
            if event_id is not None:
                state[key] = event_id
        branch, seq = _base(txn, branch)
    return state


def get_state_entry_txn(txn: Transaction, group: int, key: StateKey) -> str | None:
    """One (type, state_key) of a group's state, or None."""
    branch: int | None
    seq: int | None
    branch, seq = _version(txn, group)
    while branch is not None and seq is not None:
        row = txn.query_one(
            "SELECT event_id FROM state_entries WHERE branch_id = ? AND type = ?"
            " AND state_key = ? AND from_seq <= ? ORDER BY from_seq DESC LIMIT 1",
            (branch, key[0], key[1], seq),
        )
        if row is not None:
            return row[0] if row[0] is None else str(row[0])
        branch, seq = _base(txn, branch)
    return None


def state_delta(
    old: Mapping[StateKey, str], new: Mapping[StateKey, str]
) -> dict[StateKey, str | None]:
    """The delta that turns ``old`` into ``new``."""
    delta: dict[StateKey, str | None] = {k: v for k, v in new.items() if old.get(k) != v}
    delta.update({k: None for k in old if k not in new})
    return delta
