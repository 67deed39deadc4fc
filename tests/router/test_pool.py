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
        assert replica.healthy and replica.consecutive_failures == 1
        await pool.probe_once()
        assert not replica.healthy and pool.healthy() == []
        assert health_gauge(a.url) == 0.0
        a.health_status = 200
        await pool.probe_once()
        assert replica.healthy and replica.consecutive_failures == 0


async def test_background_probing_notices_a_replica_going_down(
    fake_replicas: StartReplicas,
) -> None:
    a, b = await fake_replicas(2)
    async with ReplicaPool([a.url, b.url], probe_interval_s=0.05, failure_threshold=2) as pool:
        assert len(pool.healthy()) == 2
        await b.stop()  # connections now refused
        await wait_until(lambda: [r.url for r in pool.healthy()] == [a.url])
        assert pool.get(b.url).consecutive_failures >= 2


async def test_health_timeout_counts_as_failure(fake_replicas: StartReplicas) -> None:
    (a,) = await fake_replicas(1)
    a.health_delay_s = 1.0
    async with ReplicaPool([a.url], probe_interval_s=60, timeout_s=0.1, failure_threshold=1) as p:
        assert p.healthy() == []


async def test_bad_metrics_keep_replica_healthy_with_unknown_load(
    fake_replicas: StartReplicas,
) -> None:
    (a,) = await fake_replicas(1)
    a.metrics_text = "# TYPE python_info gauge\npython_info 1\n"
    async with ReplicaPool([a.url], probe_interval_s=60) as pool:
        replica = pool.replicas[0]
        assert replica.healthy and replica.metrics is None and replica.load == 0


async def test_reported_failure_marks_down_until_next_probe(fake_replicas: StartReplicas) -> None:
    (a,) = await fake_replicas(1)
    async with ReplicaPool([a.url], probe_interval_s=60, failure_threshold=3) as pool:
        replica = pool.replicas[0]
        pool.report_failure(replica)
        assert not replica.healthy
        await pool.probe_once()
        assert replica.healthy


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
    ],
)
def test_bad_configuration_is_rejected(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ReplicaPool(**kwargs)


async def test_probe_before_start_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="before start"):
        await ReplicaPool(["http://a:1"]).probe_once()
