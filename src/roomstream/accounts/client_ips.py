"""Where each device was last seen from: the client IPs behind ``GET /admin/whois``.

Every authenticated request reports (user, device, IP, user agent); writing each one
would add a write transaction to every request, so, as Synapse's ``client_ips`` does,
reports are coalesced in memory and written in batches:

- a (user, device, IP) reported again within :data:`LAST_SEEN_GRANULARITY_MS` of the time
  last taken for it is ignored (a device syncing in a loop costs nothing);
- what is taken waits in a pending batch, written by one upsert transaction at most
  :data:`FLUSH_INTERVAL_S` later (or at once when :data:`MAX_PENDING` keys wait);
- reads (:meth:`ClientIps.connections`) merge the pending batch (and the one being
  written) with the table, so an answer never lags behind this process's own requests.

Invariants: the table holds one row per (user, device, IP) with the latest ``last_seen``
written (an older write never replaces a newer one); the memory is bounded
(:data:`MAX_PENDING` pending keys, the ``client_ips`` cache's remembered ones). A process
writes its pending batch as it stops; one killed loses it (a few seconds of times).
Each process writes its own requests' rows (PostgreSQL is shared by every process of a
deployment); the ``USER_IP`` replication command is not used for this.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from roomstream.lru import LruCache
from roomstream.storage import Database, Transaction

__all__ = ["ClientIps", "Connection"]

logger = logging.getLogger(__name__)

#: A (user, device, IP) is written at most once per this many milliseconds.
LAST_SEEN_GRANULARITY_MS = 60_000
#: Longest a report waits in memory before its batch is written.
FLUSH_INTERVAL_S = 5.0
#: Pending keys that make the batch be written at once.
MAX_PENDING = 10_000
#: Longest user agent kept (longer ones are cut).
MAX_USER_AGENT = 512

Key = tuple[str, str, str]  # (user ID, device ID, IP)


@dataclass(frozen=True, slots=True)
class Connection:
    ip: str
    user_agent: str
    last_seen: int


class ClientIps:
    def __init__(self, database: Database, *, clock: Callable[[], float] = time.time) -> None:
        self.db = database
        self._clock = clock
        #: key -> (user agent, last seen ms) not written yet.
        self._pending: dict[Key, tuple[str, int]] = {}
        #: key -> last seen ms taken for it (written or pending).
        self._recent: LruCache[Key, int] = LruCache("client_ips")
        #: The batch being written (still served by reads until committed).
        self._writing: dict[Key, tuple[str, int]] = {}
        #: One batch written at a time: an explicit flush waits for a scheduled one.
        self._write_lock = asyncio.Lock()
        self._flusher: asyncio.Task[None] | None = None
        self._closed = False

    def record(self, user_id: str, device_id: str, ip: str, user_agent: str) -> None:
        """A request of this device from ``ip``; cheap (no I/O), safe to call per request."""
        if self._closed:
            return
        now = int(self._clock() * 1000)
        key = (user_id, device_id, ip)
        last = self._recent.get(key)
        if last is not None and 0 <= now - last < LAST_SEEN_GRANULARITY_MS:
            return
        self._recent.set(key, now)
        self._pending[key] = (user_agent[:MAX_USER_AGENT], now)
        if self._flusher is None:
            delay = 0.0 if len(self._pending) >= MAX_PENDING else FLUSH_INTERVAL_S
            self._flusher = asyncio.get_running_loop().create_task(self._flush_after(delay))

    async def _flush_after(self, delay: float) -> None:
        try:
            await asyncio.sleep(delay)  # batching, not synchronisation: reads merge pending
        finally:
            self._flusher = None
        with contextlib.suppress(Exception):  # logged by flush; retried with the next batch
            await self.flush()

    async def flush(self) -> None:
        """Write the pending batch now (one transaction), after any batch being written.
        On failure the batch is merged back into the pending one (keeping the newer time
        per key) and logged."""
        async with self._write_lock:
            batch, self._pending = self._pending, {}
            if not batch:
                return
            self._writing = batch
            rows = [(u, d, ip, ua, seen) for (u, d, ip), (ua, seen) in batch.items()]

            def txn(t: Transaction) -> None:
                t.executemany(
                    "INSERT INTO user_ips (user_id, device_id, ip, user_agent, last_seen)"
                    " VALUES (?, ?, ?, ?, ?) ON CONFLICT (user_id, device_id, ip) DO UPDATE"
                    " SET user_agent = excluded.user_agent, last_seen = excluded.last_seen"
                    " WHERE user_ips.last_seen < excluded.last_seen",
                    rows,
                )

            try:
                await self.db.run_interaction("flush_client_ips", txn)
            except Exception:
                logger.warning("writing %d client IPs failed; kept for the next batch", len(rows))
                for key, value in batch.items():
                    newer = self._pending.get(key)
                    if newer is None or newer[1] < value[1]:
                        self._pending[key] = value
                raise
            finally:
                self._writing = {}

    async def connections(self, user_id: str) -> dict[str, list[Connection]]:
        """device ID -> where it was seen from, most recent first (the table and this
        process's pending batch)."""
        # Taken before the table is read: a batch committed after this copy is in it, one
        # committed before the read is in the table.
        unwritten = [
            (key, value)
            for batch in (self._writing, self._pending)
            for key, value in batch.items()
            if key[0] == user_id
        ]
        rows = await self.db.run_interaction(
            "client_connections",
            lambda t: t.query(
                "SELECT device_id, ip, user_agent, last_seen FROM user_ips WHERE user_id = ?",
                (user_id,),
            ),
        )
        latest: dict[tuple[str, str], Connection] = {
            (str(d), str(ip)): Connection(str(ip), str(ua), int(seen)) for d, ip, ua, seen in rows
        }
        for (_, device_id, ip), (ua, seen) in unwritten:
            known = latest.get((device_id, ip))
            if known is None or known.last_seen < seen:
                latest[(device_id, ip)] = Connection(ip, ua, seen)
        devices: dict[str, list[Connection]] = {}
        for (device_id, _), connection in latest.items():
            devices.setdefault(device_id, []).append(connection)
        for connections in devices.values():
            connections.sort(key=lambda c: (-c.last_seen, c.ip))
        return devices

    def close(self) -> None:
        """Stop taking reports and cancel a scheduled batch (it is lost: see the module
        doc; call :meth:`flush` first to keep it)."""
        self._closed = True
        if self._flusher is not None:
            self._flusher.cancel()
            self._flusher = None
