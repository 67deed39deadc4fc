"""Retry a request on another replica when the upstream failed before the client saw a byte.

The gateway wraps its upstream call in `attempt(replica)`. On a connection error, a 5xx or
a broken reply the attempt raises `UpstreamFailed`, saying whether anything was already sent
to the client: only when nothing was is a retry safe, because a second answer cannot be
spliced onto a partial one.

Every outcome goes to the pool, for the replica's circuit breaker: a failure, or a success
(an answer, a 4xx included: that is the request's fault, and the replica answered it). A
streamed reply's outcome is known only at its end: `reading_reply` reports it then, so a
reply that breaks off after its first chunk (an error event, the idle timeout, a dropped
connection) counts as a failure of its replica, never as a success.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from router.inputs import RouteHints
from router.policies import NoHealthyReplica, RoutingPolicy
from router.pool import ReplicaPool
from router.replica import Replica
from router.telemetry import FAILOVER_RETRIES

log = logging.getLogger(__name__)

T = TypeVar("T")


class UpstreamFailed(Exception):
    """An upstream request failed. `retryable` is False once bytes reached the client."""

    def __init__(self, message: str, *, retryable: bool, status: int | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.status = status


async def with_failover(
    policy: RoutingPolicy,
    pool: ReplicaPool,
    tenant: str,
    session: str,
    attempt: Callable[[Replica], Awaitable[T]],
    *,
    max_attempts: int = 3,
    hints: RouteHints | None = None,
    streamed: bool = False,
) -> T:
    """Route and run `attempt`, retrying retryable failures on replicas not yet tried.

    The replica's in-flight count covers the whole attempt, so the attempt should finish
    streaming before it returns. Every outcome is reported to the pool. Raises the last
    `UpstreamFailed` when attempts or replicas run out (NoHealthyReplica if none was tried).
    ``hints`` (prompt size, cached prefix, shared prefix) go to the policy on every attempt.
    ``streamed``: `attempt` returns a reply still being read (its first chunk in hand); its
    success is not reported here but by `reading_reply` around the rest of it.
    """
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
    tried: list[str] = []
    last: UpstreamFailed | None = None
    for _ in range(max_attempts):
        try:
            decision = await policy.choose(tenant, session, pool, exclude=tried, hints=hints)
        except NoHealthyReplica:
            if last is None:
                raise
            raise last from None
        replica = decision.replica
        if tried:
            FAILOVER_RETRIES.inc()
        tried.append(replica.url)
        try:
            with replica.track():
                result = await attempt(replica)
        except UpstreamFailed as exc:
            _report_failed(pool, replica, exc)
            if not exc.retryable:
                raise
            log.warning("upstream %s failed before first byte: %s", replica.url, exc)
            last = exc
            continue
        if not streamed:
            pool.report_success(replica)
        return result
    assert last is not None  # the loop only falls through after a retryable failure
    raise last


@contextmanager
def reading_reply(pool: ReplicaPool, replica: Replica) -> Iterator[None]:
    """Around reading the rest of a reply `with_failover(streamed=True)` returned: the
    replica's outcome once it ends. Read to its end: a success. Broken off
    (`UpstreamFailed`): a failure, as before the first chunk. Left unread for any other
    reason (the client went away): nothing, since that says nothing about the replica."""
    try:
        yield
    except UpstreamFailed as exc:
        _report_failed(pool, replica, exc)
        raise
    pool.report_success(replica)


def _report_failed(pool: ReplicaPool, replica: Replica, exc: UpstreamFailed) -> None:
    # A 4xx is the request's fault (e.g. context too long), not the replica's.
    if exc.status is not None and 400 <= exc.status < 500:
        pool.report_success(replica)
    else:
        pool.report_failure(replica)
