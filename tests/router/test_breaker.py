"""The circuit breaker's state machine (pure: the tests pass the time)."""

from __future__ import annotations

import pytest

from router.breaker import BreakerState, CircuitBreaker

CLOSED, HALF_OPEN, OPEN = BreakerState.CLOSED, BreakerState.HALF_OPEN, BreakerState.OPEN


def test_opens_only_after_failures_in_a_row() -> None:
    b = CircuitBreaker(failures=3, open_s=5)
    b.record_failure(0)
    b.record_failure(1)
    assert b.current(1) is CLOSED and b.admits(1, busy=True)
    b.record_success(2)  # an answer in between: the count starts again
    b.record_failure(3)
    b.record_failure(4)
    assert b.current(4) is CLOSED
    b.record_failure(5)
    assert b.current(5) is OPEN and not b.admits(5, busy=False)
    assert b.cooldown_s == 5


def test_half_open_after_cooldown_admits_one_request_at_a_time() -> None:
    b = CircuitBreaker(failures=1, open_s=5)
    b.record_failure(10)
    assert not b.admits(14.9, busy=False)
    assert b.current(15) is HALF_OPEN
    assert b.admits(15, busy=False) and not b.admits(15, busy=True)
    b.record_success(16)
    assert b.current(16) is CLOSED and b.admits(16, busy=True) and b.cooldown_s == 0


def test_failed_trials_double_the_cooldown_up_to_the_cap() -> None:
    b = CircuitBreaker(failures=1, open_s=5, max_open_s=12)
    b.record_failure(0)
    opened, cooldowns = 0.0, []
    for _ in range(4):
        now = opened + b.cooldown_s
        assert b.current(now) is HALF_OPEN
        b.record_failure(now)  # the trial failed
        assert b.current(now) is OPEN
        opened = now
        cooldowns.append(b.cooldown_s)
    assert cooldowns == [10, 12, 12, 12]
    b.record_success(opened + 12)
    assert b.current(opened + 12) is CLOSED
    b.record_failure(100)  # a fresh opening starts from open_s again
    assert b.cooldown_s == 5


def test_outcomes_while_open_are_ignored() -> None:
    """Requests that began before the breaker opened say nothing about the replica now."""
    b = CircuitBreaker(failures=2, open_s=5)
    b.record_failure(0)
    b.record_failure(0)
    b.record_success(1)
    assert b.current(1) is OPEN
    b.record_failure(2)
    assert b.current(2) is OPEN and b.opened_at == 0 and b.cooldown_s == 5
    assert b.current(5) is HALF_OPEN


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"failures": 0}, "failures must be >= 1"),
        ({"open_s": 0}, "0 < open_s <= max_open_s"),
        ({"open_s": 10, "max_open_s": 5}, "0 < open_s <= max_open_s"),
    ],
)
def test_bad_settings_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CircuitBreaker(**kwargs)


def test_open_for_counts_down_to_the_next_trial() -> None:
    b = CircuitBreaker(failures=1, open_s=5)
    assert b.open_for(0) == 0
    b.record_failure(10)
    assert b.open_for(11) == 4 and b.open_for(14.5) == 0.5
    assert b.open_for(15) == 0 and b.current(15) is HALF_OPEN
