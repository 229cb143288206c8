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
- base chains are at most ``MAX_BRANCH_DEPTH`` long, and a branch holds at most
  ``CLOSED_ROWS_SLACK`` closed rows beyond its live ones: past either, the next group
  starts a fresh branch from a full copy (at most one copied row per closed row).

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
#: A branch may hold this many closed rows beyond its live ones before the next change
#: starts a fresh branch from a full copy. Bounds what a read scans (about twice the live
#: state) while adding at most one stored row per closed row.
CLOSED_ROWS_SLACK = 64


class _Branch:
    __slots__ = ("branch_id", "closed", "depth", "dirty", "live", "tip")

    def __init__(self, branch_id: int, tip: int, depth: int, live: int, closed: int) -> None:
        self.branch_id = branch_id
        self.tip = tip
        self.depth = depth
        self.live = live
        self.closed = closed
        self.dirty = False


class StateGroupWriter:
    """Creates state groups within one transaction, caching branch data between calls
    and writing each branch's bookkeeping once, in :meth:`finish`."""

    def __init__(self, txn: Transaction, expected_groups: int = 1) -> None:
        self.txn = txn
        self._versions: dict[int, tuple[int, int]] = {}
        self._branches: dict[int, _Branch] = {}
        self._group_rows: list[tuple[int, str, int, int]] = []
        # Group IDs are drawn in blocks: one sequence round trip per transaction.
        self._block = max(1, expected_groups)
        self._free_ids: list[int] = []

    def create(
        self,
        room_id: str,
        parent_group: int | None,
        delta: StateDelta,
        parent_state: Mapping[StateKey, str] | None = None,
    ) -> int:
        """A new group equal to ``parent_group``'s state with ``delta`` applied.

        ``parent_state`` (the parent's full state, if the caller has it in memory) saves
        a read when a full copy is due.
        """
        txn = self.txn
        if parent_group is None:
            branch = self._new_branch(room_id, None, None, 0)
            seq = 1
            self._insert(branch, seq, {k: v for k, v in delta.items() if v is not None})
        else:
            parent_branch, parent_seq = self._version(parent_group)
            info = self._branch(parent_branch)
            at_tip = parent_seq == info.tip
            if at_tip and info.closed + len(delta) <= info.live + CLOSED_ROWS_SLACK:
                branch, seq = info, info.tip + 1
                # Only keys the parent holds have a live row to close (a merge can add
                # thousands of keys at once: no lookup for each).
                closes = [
                    (seq, info.branch_id, k[0], k[1], OPEN)
                    for k in delta
                    if parent_state is None or k in parent_state
                ]
                # "+ 0" keeps planners on the (branch, type, state_key) index: the
                # (branch, to_seq) one would scan every live row of the branch.
                txn.executemany(
                    "UPDATE state_entries SET to_seq = ? WHERE branch_id = ? AND type = ?"
                    " AND state_key = ? AND to_seq + 0 = ?",
                    closes,
                )
                closed = max(txn.rowcount, 0)  # both drivers sum executemany's rows
                info.closed += closed
                info.live -= closed
                info.tip = seq
                info.dirty = True
                self._insert(info, seq, delta)
            elif at_tip or info.depth + 1 > MAX_BRANCH_DEPTH:
                # Too much history in the branch (or too deep a base chain): a fresh
                # branch starting from a full copy.
                if parent_state is not None:
                    full = dict(parent_state)
                else:
                    self._flush_groups()  # the parent may be a group made in this txn
                    full = get_state_txn(txn, parent_group)
                for key, value in delta.items():
                    if value is None:
                        full.pop(key, None)
                    else:
                        full[key] = value
                branch = self._new_branch(room_id, None, None, 0)
                seq = 1
                self._insert(branch, seq, full)
            else:
                branch = self._new_branch(room_id, parent_branch, parent_seq, info.depth + 1)
                seq = 1
                self._insert(branch, seq, delta)
        if not self._free_ids:
            self._free_ids = txn.nextval_many("state_group_id_seq", self._block)[::-1]
        group = self._free_ids.pop()
        self._group_rows.append((group, room_id, branch.branch_id, seq))
        self._versions[group] = (branch.branch_id, seq)
        return group

    def finish(self) -> None:
        """Write the groups, and the branches' tips and row counts. Call before committing;
        group IDs drawn but not used are simply skipped (sequences may have gaps)."""
        self._flush_groups()
        rows = [(b.tip, b.live, b.closed, b.branch_id) for b in self._branches.values() if b.dirty]
        self.txn.executemany(
            "UPDATE state_branches SET tip_seq = ?, live_rows = ?, closed_rows = ?"
            " WHERE branch_id = ?",
            rows,
        )
        for b in self._branches.values():
            b.dirty = False

    def _flush_groups(self) -> None:
        self.txn.insert_many(
            "state_groups", ("state_group", "room_id", "branch_id", "seq"), self._group_rows
        )
        self._group_rows = []

    def _version(self, group: int) -> tuple[int, int]:
        version = self._versions.get(group)
        if version is None:
            version = _version(self.txn, group)
            self._versions[group] = version
        return version

    def _branch(self, branch_id: int) -> _Branch:
        info = self._branches.get(branch_id)
        if info is None:
            row = self.txn.query_one(
                "SELECT tip_seq, depth, live_rows, closed_rows FROM state_branches"
                " WHERE branch_id = ?",
                (branch_id,),
            )
            info = _Branch(branch_id, int(row[0]), int(row[1]), int(row[2]), int(row[3]))
            self._branches[branch_id] = info
        return info

    def _new_branch(
        self, room_id: str, base: int | None, base_seq: int | None, depth: int
    ) -> _Branch:
        branch_id = self.txn.nextval_many("state_branch_id_seq", 1)[0]
        self.txn.execute(
            "INSERT INTO state_branches (branch_id, room_id, base_branch_id, base_seq, depth,"
            " tip_seq) VALUES (?, ?, ?, ?, ?, 1)",
            (branch_id, room_id, base, base_seq, depth),
        )
        info = _Branch(branch_id, 1, depth, 0, 0)
        info.dirty = True
        self._branches[branch_id] = info
        return info

    def _insert(self, branch: _Branch, seq: int, delta: StateDelta) -> None:
        self.txn.insert_many(
            "state_entries",
            ("branch_id", "type", "state_key", "event_id", "from_seq", "to_seq"),
            [(branch.branch_id, k[0], k[1], v, seq, OPEN) for k, v in delta.items()],
        )
        branch.live += len(delta)
        branch.dirty = True


def create_state_group_txn(
    txn: Transaction,
    room_id: str,
    parent_group: int | None,
    delta: StateDelta,
    parent_state: Mapping[StateKey, str] | None = None,
) -> int:
    """Create one state group (see :class:`StateGroupWriter` for many in a transaction)."""
    writer = StateGroupWriter(txn)
    group = writer.create(room_id, parent_group, delta, parent_state)
    writer.finish()
    return group


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
