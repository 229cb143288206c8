"""tests.support.wait.wait_for: the one poll helper of the test suite."""

from __future__ import annotations

import pytest

from tests.support.wait import wait_for


async def test_returns_the_first_truthy_value_of_a_sync_or_async_condition() -> None:
    calls = iter([0, None, "", 7, 8])
    assert await wait_for(lambda: next(calls), what="a number") == 7

    answers = iter([False, {"ok": 1}])

    async def check() -> object:
        return next(answers)

    assert await wait_for(check) == {"ok": 1}


async def test_ignored_exceptions_mean_not_yet_others_propagate() -> None:
    attempts = []

    def flaky() -> bool:
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionRefusedError
        return True

    assert await wait_for(flaky, ignoring=(OSError,)) is True
    assert len(attempts) == 3

    def broken() -> bool:
        raise KeyError("x")

    with pytest.raises(KeyError):
        await wait_for(broken, ignoring=(OSError,))


async def test_fails_at_the_deadline_naming_what_and_the_details() -> None:
    with pytest.raises(AssertionError, match="timed out waiting for the moon:\nlog tail"):
        await wait_for(lambda: False, 0.02, "the moon", details=lambda: "log tail")
