"""One upstream vLLM replica as the router sees it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from router.breaker import CircuitBreaker
from router.metrics import ReplicaMetrics


@dataclass(eq=False)
class Replica:
    """Mutable state of one replica; the pool's prober and the gateway update it in place.

    `healthy` is what the health probes say, and starts False: a replica is not routed to
    before its first successful probe. `breaker` is what the gateway's own requests say
    (router/breaker.py); a replica is routed to when both agree.
    """

    url: str
    healthy: bool = False
    metrics: ReplicaMetrics | None = None
    failed_probes: int = 0  # in a row
    # Pool clock: when the last probe round began, and when the gateway's last request to
    # this replica succeeded (`ReplicaPool.report_success`): a probe that times out while
    # requests succeed is this process's slowness, not the replica's.
    probed_at: float | None = None
    served_at: float | None = None
    in_flight: int = 0
    # Of those, the requests whose prefill this gateway sized and whose first chunk is not
    # in yet, and their prompt tokens the replica does not hold: the prefill work it sent
    # there that is still ahead of a new request (``prefill``).
    prefilling: int = 0
    prefill_backlog_tokens: int = 0
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)

    @property
    def load(self) -> float:
        """Engine load from the latest scrape plus requests this gateway has in flight.

        The in-flight part reacts between scrapes, so a burst of new sessions spreads out
        instead of all landing on whichever replica looked idle at the last scrape.
        """
        scraped = self.metrics.load if self.metrics is not None else 0.0
        return scraped + self.in_flight

    @contextmanager
    def track(self) -> Iterator[None]:
        """Count one gateway request against this replica while the block runs (the
        simulator, whose requests span events, calls ``started`` and ``ended`` itself)."""
        self.started()
        try:
            yield
        finally:
            self.ended()

    def started(self) -> None:
        """A request was sent here."""
        self.in_flight += 1

    def ended(self) -> None:
        """A request sent here ended (its reply read to its end, or given up)."""
        self.in_flight -= 1

    @contextmanager
    def prefill(self, tokens: int | None) -> Iterator[None]:
        """Count ``tokens``, a request's prefill here (``router.session_route.
        prefill_estimate``; None: not sized), as this replica's backlog while the block
        runs: from the send until its first chunk is in hand (vLLM streams nothing before
        the prefill is done), or it failed. The simulator, whose requests span events,
        calls ``prefill_started`` and ``prefill_ended`` itself."""
        if tokens is None:
            yield
            return
        self.prefill_started(tokens)
        try:
            yield
        finally:
            self.prefill_ended(tokens)

    def prefill_started(self, tokens: int) -> None:
        self.prefilling += 1
        self.prefill_backlog_tokens += tokens

    def prefill_ended(self, tokens: int) -> None:
        self.prefilling -= 1
        self.prefill_backlog_tokens -= tokens
