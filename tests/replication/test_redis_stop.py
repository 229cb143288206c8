"""Stopping the Redis link ends its loops even when a cancellation is lost on the way.

A CancelledError delivered inside a redis-py call can come back as a RedisError; the
publish loop retries those, so before the fix ``stop()`` waited for it forever (seen as a
replication test teardown hanging for minutes under load).
"""

from __future__ import annotations

import asyncio
import uuid

from redis.exceptions import RedisError

from roomstream.replication.commands import ReplicateCommand
from roomstream.replication.redis_transport import RedisReplication


async def test_stop_ends_when_a_publish_swallows_the_cancellation(redis_url: str) -> None:
    link = RedisReplication(
        server_name=f"stop-{uuid.uuid4().hex[:8]}.test", instance_name="w1", url=redis_url
    )
    publishing = asyncio.Event()

    async def publish(batch: list[object]) -> None:
        publishing.set()
        try:
            await asyncio.Event().wait()  # a publish stuck on its connection
        except asyncio.CancelledError:
            raise RedisError("connection closed") from None  # the cancellation, lost

    link._publish = publish  # type: ignore[method-assign,assignment]
    await link.start()
    link.send(ReplicateCommand())
    await asyncio.wait_for(publishing.wait(), 30)
    stop = asyncio.ensure_future(link.stop())
    done, _ = await asyncio.wait({stop}, timeout=30)
    assert done, "stop() hung on the publish loop"
    stop.result()
