"""Long computations on the event loop give way to other tasks.

Authorization and state resolution are CPU work that runs on the event loop. A merge in a
big room (state resolution over thousands of events) would otherwise hold the loop for
seconds, and every other room's sends, commits and announcements with it (Synapse's issue
#16633). Two tools keep rooms independent:

* :func:`cooperate`: loops that can run long call it once per step; it yields to the loop
  when the thread has run for :data:`SLICE_SECONDS` since the last yield and pauses there
  for :data:`PAUSE_SECONDS`, so other ready tasks run at least every slice and whatever
  they wait for (database threads, the database server on the same cores) gets the CPU.
  Otherwise it costs one clock read. Yielding never changes a result: the caller holds
  whatever lock protects its data. The pause costs a lone computation a fifth of its
  speed; a loop that serves nothing else (a bulk import task) turns it off with
  :func:`set_pause`.
* :func:`off_loop`: a synchronous computation over big inputs (the auth chain index's set
  algebra) runs on a worker thread; the interpreter's GIL switching then lets the loop run
  meanwhile. Only for functions that touch no state another task may change while they
  run.

While the loop computes, the database worker threads still need the GIL to run their
(short) Python parts, and by default they get it only after ``sys.getswitchinterval()``
(5 ms) each time: a send's few database round trips would then wait tens of
milliseconds behind another room's merge. Server processes therefore shorten the interval
to :data:`SWITCH_INTERVAL_SECONDS` (:func:`shorten_switch_interval`, called by
``RoomEngine.open``); with no contention the interval changes nothing.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

#: Longest stretch of cooperating work between two yields to the event loop.
SLICE_SECONDS = 0.002
#: How long a yield pauses: with the loop idle in ``select`` for that long, database
#: threads hold the GIL uncontended and ready tasks' I/O completes (a zero sleep would
#: take the GIL back at once). Measured better than pausing only while database
#: interactions are in flight (bench/bench_independence.py).
PAUSE_SECONDS = 0.0005
#: The interpreter's thread switch interval in server processes (default 5 ms).
SWITCH_INTERVAL_SECONDS = 0.001
#: Inputs at least this big (elements) are worth a thread hop in :func:`off_loop`.
OFF_LOOP_MIN_SIZE = 2_000

_last_yield = time.perf_counter()
_pause: ContextVar[float] = ContextVar("roomstream_cooperative_pause", default=PAUSE_SECONDS)


def set_pause(seconds: float) -> None:
    """Set the pause of :func:`cooperate` for the current context (and the tasks it
    creates afterwards); 0 for a loop where nobody waits for anything else."""
    _pause.set(seconds)


async def cooperate() -> None:
    """Yield to the event loop if the current slice is used up."""
    global _last_yield
    now = time.perf_counter()
    if now - _last_yield >= SLICE_SECONDS:
        await asyncio.sleep(_pause.get())
        _last_yield = time.perf_counter()


async def off_loop(size: int, func: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """``func(*args, **kwargs)``, on a worker thread when ``size`` (the input's element
    count) is at least :data:`OFF_LOOP_MIN_SIZE`, else inline (a thread hop costs more
    than a small computation)."""
    if size < OFF_LOOP_MIN_SIZE:
        return func(*args, **kwargs)
    return await asyncio.to_thread(func, *args, **kwargs)


def shorten_switch_interval() -> None:
    """Let database threads take the GIL from a busy event loop within
    :data:`SWITCH_INTERVAL_SECONDS` (never lengthens an interval set shorter)."""
    if sys.getswitchinterval() > SWITCH_INTERVAL_SECONDS:
        sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)
