"""A circuit breaker per replica: requests stop going to a replica that keeps failing them.

One failed request says little: a replica can fail one request (a hiccup, an engine that
restarted a step) and serve the next. So the breaker opens only after ``failures`` failed
requests in a row, where failed means what failover retries (a connection error, a 5xx, no
first chunk in time, a stream the replica cut or garbled) or a reply that broke off after
its first chunk; a success is a reply read to its end. A 4xx is the request's fault and
counts as the replica answering.

- closed: routed. A success resets the count of failures in a row.
- open: not routed, for ``open_s`` seconds after it opened.
- half-open: the cool-down is over. Routed one request at a time (the caller says whether
  one is in flight there): each is a probe of the path that failed, which a ``/health``
  probe is not (it passes on a replica whose engine fails every request). A failed probe
  request is retried elsewhere by failover, so the client does not see it. The first
  success closes the breaker; a failure opens it again for twice the last cool-down, up to
  ``max_open_s``, so a replica that stays broken costs one request per cool-down.

Outcomes of requests that began before the breaker opened are ignored while it is open:
they describe the replica before the evidence that opened it.

Pure: the caller passes the time (monotonic seconds); it reads no clock and does no I/O.
The pool feeds it outcomes and turns its state into routing, logs and metrics.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class BreakerState(IntEnum):
    """The value is what the state gauge reports."""

    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


@dataclass
class CircuitBreaker:
    failures: int = 3
    open_s: float = 5.0
    max_open_s: float = 60.0
    state: BreakerState = BreakerState.CLOSED
    failures_in_a_row: int = 0
    cooldown_s: float = 0.0
    opened_at: float = 0.0

    def __post_init__(self) -> None:
        if self.failures < 1:
            raise ValueError(f"breaker failures must be >= 1, got {self.failures}")
        if not 0 < self.open_s <= self.max_open_s:
            raise ValueError(
                f"breaker needs 0 < open_s <= max_open_s, got {self.open_s}, {self.max_open_s}"
            )

    def current(self, now: float) -> BreakerState:
        """The state at ``now``: an open breaker whose cool-down is over is half-open."""
        if self.state is BreakerState.OPEN and now >= self.opened_at + self.cooldown_s:
            self.state = BreakerState.HALF_OPEN
        return self.state

    def open_for(self, now: float) -> float:
        """Seconds until an open breaker turns half-open (its next trial); 0 when not open."""
        if self.current(now) is not BreakerState.OPEN:
            return 0.0
        return self.opened_at + self.cooldown_s - now

    def admits(self, now: float, busy: bool) -> bool:
        """Whether a new request may go to the replica; ``busy``: one is in flight there."""
        state = self.current(now)
        return state is BreakerState.CLOSED or (state is BreakerState.HALF_OPEN and not busy)

    def record_success(self, now: float) -> None:
        state = self.current(now)
        if state is BreakerState.OPEN:
            return
        self.failures_in_a_row = 0
        if state is BreakerState.HALF_OPEN:
            self.state = BreakerState.CLOSED
            self.cooldown_s = 0.0

    def record_failure(self, now: float) -> None:
        state = self.current(now)
        if state is BreakerState.HALF_OPEN:
            self._open(now, min(self.cooldown_s * 2, self.max_open_s))
        elif state is BreakerState.CLOSED:
            self.failures_in_a_row += 1
            if self.failures_in_a_row >= self.failures:
                self._open(now, self.open_s)

    def _open(self, now: float, cooldown_s: float) -> None:
        self.state = BreakerState.OPEN
        self.opened_at = now
        self.cooldown_s = cooldown_s
        self.failures_in_a_row = 0
