"""The one way tests wait for something another task or process does: poll a condition.

A deadline bounds how long a FAILING test takes (generous, for a loaded machine); it never
decides whether a passing test passes. The sleep between polls is short and only yields;
it is not synchronisation.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def wait_for(
    condition: Callable[[], T | Awaitable[T]],
    limit: float = 60.0,
    what: str = "",
    *,
    interval: float = 0.005,
    ignoring: tuple[type[BaseException], ...] = (),
    details: Callable[[], str] | None = None,
) -> T:
    """Call ``condition`` (sync or async) until it returns a truthy value; that value.

    An exception of a type in ``ignoring`` counts as "not yet" (a server not listening
    yet, say). After ``limit`` seconds: AssertionError naming ``what``, followed by
    ``details()`` (logs, say).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while True:
        try:
            result = condition()
            if inspect.isawaitable(result):
                result = await result
        except ignoring:
            result = None
        if result:
            return result  # type: ignore[return-value]
        if loop.time() > deadline:
            extra = "" if details is None else ":\n" + details()
            raise AssertionError(f"timed out waiting for {what or condition}{extra}")
        await asyncio.sleep(interval)
