import asyncio
from collections.abc import Awaitable, Callable

import pytest
from prometheus_client import REGISTRY

from router import ReplicaPool
from tests.router.fake_replica import FakeReplica, vllm_metrics_text

StartReplicas = Callable[[int], Awaitable[list[FakeReplica]]]


def health_gauge(url: str) -> float | None:
    return REGISTRY.get_sample_value("foldgate_router_replica_healthy", {"replica": url})


async def wait_until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


async def test_start_probes_health_and_scrapes_metrics(fake_replicas: StartReplicas) -> None:
    a, b = await fake_replicas(2)
    a.metrics_text = vllm_metrics_text(running=3, waiting=1, kv=0.5)
    async with ReplicaPool([a.url, b.url + "/"]) as pool:
        assert [r.url for r in pool.healthy()] == [a.url, b.url]
        ra = pool.get(a.url)
        assert ra is not None and ra.metrics is not None
        assert (ra.metrics.running, ra.metrics.waiting, ra.metrics.kv_cache_usage) == (3, 1, 0.5)
        assert ra.load == 4
        assert health_gauge(a.url) == 1.0
    assert health_gauge(a.url) is None  # series removed on close


async def test_failing_health_marks_down_after_threshold_and_recovers(
    fake_replicas: StartReplicas,
) -> None:
    (a,) = await fake_replicas(1)
    async with ReplicaPool([a.url], probe_interval_s=60, failure_threshold=2) as pool:
        replica = pool.replicas[0]
        a.health_status = 503
        await pool.probe_once()
        assert replica.healthy and replica.failed_probes == 1
        await pool.probe_once()
        assert not replica.healthy and pool.healthy() == []
        assert health_gauge(a.url) == 0.0
        a.health_status = 200
        await pool.probe_once()
        assert replica.healthy and replica.failed_probes == 0


async def test_background_probing_notices_a_replica_going_down(
    fake_replicas: StartReplicas,
) -> None:
    a, b = await fake_replicas(2)
    async with ReplicaPool([a.url, b.url], probe_interval_s=0.05, failure_threshold=2) as pool:
        assert len(pool.healthy()) == 2
        await b.stop()  # connections now refused
        await wait_until(lambda: [r.url for r in pool.healthy()] == [a.url])
        assert pool.get(b.url).failed_probes >= 2


async def test_health_timeout_counts_as_failure(fake_replicas: StartReplicas) -> None:
    (a,) = await fake_replicas(1)
    a.health_delay_s = 1.0
    async with ReplicaPool([a.url], probe_interval_s=60, timeout_s=0.1, failure_threshold=1) as p:
        assert p.healthy() == []


async def test_a_probe_late_on_a_busy_event_loop_keeps_a_replica_that_serves(
    fake_replicas: StartReplicas,
) -> None:
    # bench/overhead.py --curve at 64 sessions: the gateway's loop, not the replica, was
    # slow; taking its only replica down refused most requests ("no model server available").
    (a,) = await fake_replicas(1)
    async with ReplicaPool([a.url], probe_interval_s=60, timeout_s=0.05, failure_threshold=2) as p:
        replica = p.replicas[0]
        a.health_loop_stall_s = 0.3  # past the probe's timeout
        for _ in range(3):
            p.report_success(replica)  # a request to it succeeded since the last round
            await p.probe_once()
        assert replica.healthy and replica.failed_probes == 0
        assert p.healthy() == [replica]


async def test_a_probe_late_on_a_busy_event_loop_counts_when_nothing_was_served(
    fake_replicas: StartReplicas,
) -> None:
    # The same stall times the probe out; with no request served meanwhile it is what it
    # looks like (a replica that stopped answering) and counts as before.
    (a,) = await fake_replicas(1)
    async with ReplicaPool([a.url], probe_interval_s=60, timeout_s=0.05, failure_threshold=2) as p:
        replica = p.replicas[0]
        p.report_success(replica)  # served, but before the last round: says nothing now
        await p.probe_once()
        a.health_loop_stall_s = 0.3  # past the probe's timeout
        for _ in range(2):
            await p.probe_once()
        assert not replica.healthy and p.healthy() == []


async def test_bad_metrics_keep_replica_healthy_with_unknown_load(
    fake_replicas: StartReplicas,
) -> None:
    (a,) = await fake_replicas(1)
    a.metrics_text = "# TYPE python_info gauge\npython_info 1\n"
    async with ReplicaPool([a.url], probe_interval_s=60) as pool:
        replica = pool.replicas[0]
        assert replica.healthy and replica.metrics is None and replica.load == 0


def breaker_gauge(url: str) -> float | None:
    return REGISTRY.get_sample_value("foldgate_router_breaker_state", {"replica": url})


def breaker_opened(url: str) -> float:
    return REGISTRY.get_sample_value("foldgate_router_breaker_opened_total", {"replica": url}) or 0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_one_failed_request_keeps_the_replica_repeated_ones_open_its_breaker(
    fake_replicas: StartReplicas,
) -> None:
    (a,) = await fake_replicas(1)
    clock = Clock()
    async with ReplicaPool(
        [a.url], probe_interval_s=60, breaker_failures=3, breaker_open_s=5, clock=clock
    ) as pool:
        replica = pool.replicas[0]
        assert breaker_gauge(a.url) == 0
        pool.report_failure(replica)
        pool.report_failure(replica)
        assert pool.routable() == [replica] and pool.healthy() == [replica]
        pool.report_success(replica)
        pool.report_failure(replica)
        pool.report_failure(replica)
        assert pool.routable() == [replica]
        pool.report_failure(replica)  # the third in a row
        assert pool.routable() == [] and pool.healthy() == []
        assert breaker_gauge(a.url) == 2 and breaker_opened(a.url) == 1
        await pool.probe_once()  # a passing /health does not close it: requests failed
        assert pool.routable() == [] and replica.healthy


async def test_half_open_trial_request_brings_the_replica_back(
    fake_replicas: StartReplicas,
) -> None:
    (a,) = await fake_replicas(1)
    clock = Clock()
    async with ReplicaPool(
        [a.url], probe_interval_s=60, breaker_failures=1, breaker_open_s=5, clock=clock
    ) as pool:
        replica = pool.replicas[0]
        pool.report_failure(replica)
        clock.now += 5
        await pool.probe_once()
        assert breaker_gauge(a.url) == 1  # the probe round shows the cool-down's end
        with replica.track():  # a trial in flight: nothing else goes there meanwhile
            assert pool.routable() == [] and pool.healthy() == [replica]
            pool.report_failure(replica)  # ...and it failed: out for twice as long
        assert breaker_gauge(a.url) == 2 and replica.breaker.cooldown_s == 10
        clock.now += 9.9
        assert pool.routable() == []
        clock.now += 0.1
        assert pool.routable() == [replica]
        pool.report_success(replica)
        assert breaker_gauge(a.url) == 0 and replica.breaker.cooldown_s == 0
        with replica.track():
            assert pool.routable() == [replica]  # closed: any number in flight
    assert breaker_gauge(a.url) is None  # series removed on close


async def test_a_replica_down_by_probes_stays_out_whatever_its_breaker_says(
    fake_replicas: StartReplicas,
) -> None:
    (a,) = await fake_replicas(1)
    async with ReplicaPool([a.url], probe_interval_s=60, failure_threshold=1) as pool:
        a.health_status = 503
        await pool.probe_once()
        assert pool.routable() == [] and pool.replicas[0].breaker.state == 0
        a.health_status = 200
        await pool.probe_once()
        assert pool.routable() == pool.replicas


async def test_dns_discovery_of_replicas(fake_replicas: StartReplicas) -> None:
    (a,) = await fake_replicas(1)
    async with ReplicaPool(dns_name="localhost", port=a.port, probe_interval_s=60) as pool:
        assert a.url in [r.url for r in pool.healthy()]


async def test_dns_failure_keeps_members(fake_replicas: StartReplicas) -> None:
    (a,) = await fake_replicas(1)
    async with ReplicaPool(dns_name="localhost", port=a.port, probe_interval_s=60) as pool:
        members = [r.url for r in pool.replicas]
        pool._dns_name = "no-such-host.invalid"  # the resolver now fails for this service
        await pool.probe_once()
        assert [r.url for r in pool.replicas] == members


async def test_unresolvable_dns_name_gives_an_empty_pool() -> None:
    async with ReplicaPool(dns_name="no-such-host.invalid", port=8000) as pool:
        assert pool.replicas == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one of"),
        ({"urls": ["http://a:1"], "dns_name": "x", "port": 1}, "exactly one of"),
        ({"urls": ["a:8000"]}, "must be http"),
        ({"urls": ["http://a:1", "http://a:1/"]}, "duplicate replica URLs"),
        ({"dns_name": "svc"}, "needs the replicas' port"),
        ({"urls": ["http://a:1"], "probe_interval_s": 0}, "must be positive"),
        ({"urls": ["http://a:1"], "failure_threshold": 0}, "failure_threshold"),
        ({"urls": ["http://a:1"], "breaker_failures": 0}, "breaker failures"),
        ({"urls": ["http://a:1"], "breaker_open_s": 90}, "open_s <= max_open_s"),
    ],
)
def test_bad_configuration_is_rejected(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ReplicaPool(**kwargs)


async def test_probe_before_start_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="before start"):
        await ReplicaPool(["http://a:1"]).probe_once()


def test_retry_after_is_the_earliest_replicas_next_trial() -> None:
    """What a 503 for "no healthy replica" tells the client: when a breaker next lets a
    trial through, or a replica the probes took out is probed again (at least 1 s)."""
    clock = Clock()
    a, b = "http://127.0.0.1:9", "http://127.0.0.1:10"
    pool = ReplicaPool(
        [a, b], probe_interval_s=2, breaker_failures=1, breaker_open_s=5, clock=clock
    )
    ra, rb = pool.replicas
    ra.healthy = rb.healthy = True  # as after a passing probe
    pool.report_failure(ra)  # open for 5 s
    clock.now += 1
    pool.report_failure(rb)  # open for 5 s, a second later
    assert pool.routable() == [] and pool.retry_after_s() == 4  # a's trial, in 4 s
    clock.now += 3.5
    assert pool.retry_after_s() == 1  # 0.5 s, rounded up
    clock.now += 0.5  # a is half-open: admits a trial; busy with one, the client waits 1 s
    with ra.track():
        assert pool.routable() == [] and pool.retry_after_s() == 1
    pool.report_failure(ra)  # the trial failed: out for 10 s; b turns half-open in 1 s
    assert pool.retry_after_s() == 1
    clock.now += 1
    pool.report_failure(rb)  # b's trial failed too: out for 10 s from now
    assert pool.retry_after_s() == 9  # a's trial comes first
    ra.healthy = rb.healthy = False  # taken out by probes too: the next probe after that
    clock.now += 9
    assert pool.retry_after_s() == 2
