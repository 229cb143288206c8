"""The per-origin token bucket against a naive oracle (every request's time kept)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roomstream.federation.auth import OriginRateLimiter


def test_burst_then_refill() -> None:
    limiter = OriginRateLimiter(per_second=2.0, burst=3)
    assert [limiter.take("a", 0.0) for _ in range(3)] == [None, None, None]
    assert limiter.take("a", 0.0) == pytest.approx(0.5)
    assert limiter.take("b", 0.0) is None  # origins are independent
    assert limiter.take("a", 0.5) is None
    assert limiter.take("a", 0.5) is not None
    assert [limiter.take("a", 100.0) for _ in range(4)][-1] is not None  # never above burst


@settings(max_examples=200, deadline=None)
@given(
    per_second=st.sampled_from([0.5, 1.0, 4.0]),
    burst=st.integers(1, 5),
    gaps=st.lists(st.sampled_from([0.0, 0.0, 0.1, 0.25, 1.0, 3.0]), max_size=40),
)
def test_never_more_than_burst_plus_rate(per_second: float, burst: int, gaps: list[float]) -> None:
    """Over every window [t0, t1], the requests let through number at most
    burst + per_second * (t1 - t0); and a request refused had fewer than one token."""
    limiter = OriginRateLimiter(per_second, burst)
    now = 0.0
    allowed: list[float] = []
    for gap in gaps:
        now += gap
        if limiter.take("o", now) is None:
            allowed.append(now)
    for i, start in enumerate(allowed):
        for j in range(i, len(allowed)):
            assert j - i + 1 <= burst + per_second * (allowed[j] - start) + 1e-9
    # With nothing spent for long enough, the whole burst is available again.
    later = now + burst / per_second + 1
    assert all(limiter.take("o", later) is None for _ in range(burst))
