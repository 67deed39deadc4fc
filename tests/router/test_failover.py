import asyncio
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
from prometheus_client import REGISTRY

from router import (
    AssignmentStore,
    NoHealthyReplica,
    Replica,
    ReplicaPool,
    UpstreamFailed,
    make_policy,
    reading_reply,
    with_failover,
)
from tests.router.fake_replica import FakeReplica, vllm_metrics_text

StartReplicas = Callable[[int], Awaitable[list[FakeReplica]]]


def retries() -> float:
    return REGISTRY.get_sample_value("foldgate_router_failover_retries_total") or 0.0


def http_attempt(
    http: aiohttp.ClientSession, tried: list[str]
) -> Callable[[Replica], Awaitable[str]]:
    """What the gateway does before streaming: connect, check status, nothing sent yet."""

    async def attempt(replica: Replica) -> str:
        tried.append(replica.url)
        assert replica.in_flight == 1
        try:
            async with http.post(f"{replica.url}/v1/completions", json={}) as resp:
                if resp.status >= 500:
                    raise UpstreamFailed(f"{resp.status}", retryable=True, status=resp.status)
                return (await resp.json())["replica"]
        except aiohttp.ClientConnectionError as exc:
            raise UpstreamFailed(str(exc), retryable=True) from exc

    return attempt


async def test_retries_5xx_and_connection_error_on_other_replicas(
    fake_replicas: StartReplicas,
) -> None:
    a, b, c = await fake_replicas(3)
    for load, r in enumerate((a, b, c)):
        r.metrics_text = vllm_metrics_text(running=load)  # fixes the order they are tried in
    a.completion_status = 503
    async with ReplicaPool([a.url, b.url, c.url], probe_interval_s=60) as pool:
        await b.stop()  # the pool still believes b is healthy: only the request finds out
        before = retries()
        tried: list[str] = []
        async with aiohttp.ClientSession() as http:
            served_by = await with_failover(
                make_policy("least_loaded"), pool, "t", "s", http_attempt(http, tried)
            )
        assert tried == [a.url, b.url, c.url] and served_by == c.url
        assert retries() == before + 2
        # every outcome was reported; one failure does not take a replica out
        assert [r.breaker.failures_in_a_row for r in pool.replicas] == [1, 1, 0]
        assert len(pool.healthy()) == 3
        assert all(r.in_flight == 0 for r in pool.replicas)


async def test_sticky_session_moves_off_a_failing_replica(
    fake_replicas: StartReplicas, assignments: AssignmentStore
) -> None:
    a, b = await fake_replicas(2)
    policy = make_policy("sticky", assignments=assignments)
    async with ReplicaPool([a.url, b.url], probe_interval_s=60) as pool:
        async with aiohttp.ClientSession() as http:
            home = await with_failover(policy, pool, "t", "s", http_attempt(http, []))
            broken, other = (a, b) if home == a.url else (b, a)
            broken.completion_status = 500
            tried: list[str] = []
            served_by = await with_failover(policy, pool, "t", "s", http_attempt(http, tried))
        assert tried == [broken.url, other.url] and served_by == other.url
        assert await assignments.get_assignment("t", "s") == other.url


async def test_no_retry_after_bytes_were_sent(fake_replicas: StartReplicas) -> None:
    a, b = await fake_replicas(2)
    async with ReplicaPool([a.url, b.url], probe_interval_s=60) as pool:
        tried: list[str] = []

        async def attempt(replica: Replica) -> str:
            tried.append(replica.url)
            raise UpstreamFailed("stream cut mid-answer", retryable=False)

        with pytest.raises(UpstreamFailed, match="stream cut"):
            await with_failover(make_policy("least_loaded"), pool, "t", "s", attempt)
        assert len(tried) == 1
        assert pool.get(tried[0]).breaker.failures_in_a_row == 1


async def test_attempts_are_bounded(fake_replicas: StartReplicas) -> None:
    replicas = await fake_replicas(4)
    for r in replicas:
        r.completion_status = 502
    async with ReplicaPool([r.url for r in replicas], probe_interval_s=60) as pool:
        tried: list[str] = []
        async with aiohttp.ClientSession() as http:
            with pytest.raises(UpstreamFailed) as info:
                await with_failover(
                    make_policy("round_robin"),
                    pool,
                    "t",
                    "s",
                    http_attempt(http, tried),
                    max_attempts=3,
                )
        assert info.value.status == 502
        assert len(tried) == 3 and len(set(tried)) == 3
        assert sum(r.completion_calls for r in replicas) == 3


async def test_running_out_of_replicas_raises_the_upstream_error(
    fake_replicas: StartReplicas,
) -> None:
    (a,) = await fake_replicas(1)
    a.completion_status = 500
    async with ReplicaPool([a.url], probe_interval_s=60, breaker_failures=2) as pool:
        async with aiohttp.ClientSession() as http:
            for _ in range(2):  # the second failure in a row opens the breaker
                with pytest.raises(UpstreamFailed, match="500"):
                    await with_failover(
                        make_policy("round_robin"), pool, "t", "s", http_attempt(http, [])
                    )
        # With nothing routable left, no attempt is made at all.
        with pytest.raises(NoHealthyReplica):
            await with_failover(make_policy("round_robin"), pool, "t", "s", http_attempt(http, []))


async def test_other_exceptions_propagate_without_retry() -> None:
    pool = ReplicaPool(["http://a:1", "http://b:1"])
    for r in pool.replicas:
        r.healthy = True
    calls = 0

    async def attempt(replica: Replica) -> None:
        nonlocal calls
        calls += 1
        raise KeyError("bug in the gateway")

    with pytest.raises(KeyError):
        await with_failover(make_policy("round_robin"), pool, "t", "s", attempt)
    assert calls == 1 and len(pool.healthy()) == 2


async def test_max_attempts_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        await with_failover(
            make_policy("round_robin"), ReplicaPool(["http://a:1"]), "t", "s", None, max_attempts=0
        )  # type: ignore[arg-type]


async def test_a_4xx_counts_as_the_replica_answering(fake_replicas: StartReplicas) -> None:
    (a,) = await fake_replicas(1)
    async with ReplicaPool([a.url], probe_interval_s=60, breaker_failures=2) as pool:
        replica = pool.replicas[0]
        pool.report_failure(replica)

        async def refused(replica: Replica) -> None:
            raise UpstreamFailed("context too long", retryable=False, status=400)

        with pytest.raises(UpstreamFailed):
            await with_failover(make_policy("round_robin"), pool, "t", "s", refused)
        assert replica.breaker.failures_in_a_row == 0
        pool.report_failure(replica)
        assert pool.routable() == [replica]


async def test_a_replica_failing_every_request_is_taken_out_and_tried_again_later(
    fake_replicas: StartReplicas,
) -> None:
    """Requests keep succeeding (failover) while one replica fails each one it gets; after
    ``breaker_failures`` in a row it gets none until its cool-down ends, then one trial."""
    good, bad = await fake_replicas(2)
    bad.completion_status = 500
    now = [0.0]
    async with ReplicaPool(
        [good.url, bad.url],
        probe_interval_s=60,
        breaker_failures=2,
        breaker_open_s=5,
        clock=lambda: now[0],
    ) as pool:
        policy = make_policy("round_robin")
        async with aiohttp.ClientSession() as http:
            served = [
                await with_failover(policy, pool, "t", "s", http_attempt(http, []))
                for _ in range(10)
            ]
            assert served == [good.url] * 10
            assert bad.completion_calls == 2  # then its breaker opened
            now[0] += 5
            bad.completion_status = 200  # it recovered meanwhile
            served = [
                await with_failover(policy, pool, "t", "s", http_attempt(http, []))
                for _ in range(4)
            ]
        assert bad.url in served and pool.get(bad.url).breaker.state == 0


def test_reading_reply_reports_its_outcome_when_the_reply_ends() -> None:
    pool = ReplicaPool(["http://127.0.0.1:9"], breaker_failures=3)
    (replica,) = pool.replicas
    for _ in range(2):  # broken off after the first chunk: a failure of the replica
        with pytest.raises(UpstreamFailed), reading_reply(pool, replica):
            raise UpstreamFailed("stream broke", retryable=False)
    assert replica.breaker.failures_in_a_row == 2
    with pytest.raises(asyncio.CancelledError), reading_reply(pool, replica):
        raise asyncio.CancelledError  # the client went away: says nothing about the replica
    assert replica.breaker.failures_in_a_row == 2
    with reading_reply(pool, replica):
        pass  # read to its end
    assert replica.breaker.failures_in_a_row == 0
    with pytest.raises(UpstreamFailed), reading_reply(pool, replica):
        raise UpstreamFailed("bad request", retryable=False, status=400)  # the request's fault
    assert replica.breaker.failures_in_a_row == 0
