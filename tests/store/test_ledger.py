"""The ledger contract (store.ledger: counters, request logs, quota charges, leases), run
against every backend (real Redis, SQLite)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

from store import Charge, HeldLease, LeaseClaim, NotFound, Refusal, SessionStore
from tests.store.conftest import StoreFactory, history, msg


async def test_counts_add_up_and_a_retry_adds_nothing(
    make_store: StoreFactory, tenant: str
) -> None:
    a, b = make_store(), make_store()
    try:
        await a.ingest(tenant, "s", history(2))
        await a.ingest(tenant, "s", [*history(1), msg("assistant", "fork")])
        assert await a.get_counts(tenant, "s", 0) == {}
        await a.add_counts(tenant, "s", 0, {"requests": 1, "tokens": 40}, token="r1")
        await b.add_counts(tenant, "s", 0, {"requests": 1, "tokens": 40}, token="r1")  # retry
        await b.add_counts(tenant, "s", 0, {"requests": 1, "tokens": 40}, token="r2")  # equal
        await a.add_counts(tenant, "s", 1, {"requests": 1, "tokens": -5}, token="r3")
        await a.add_counts(tenant, "s", 0, {"restores": 0}, token="r6", latest={"last": 7})
        await b.add_counts(tenant, "s", 0, {}, token="r7", latest={"last": 3})  # set, not added
        # adding 0 writes nothing (a counter never added to is absent: 0 to its readers)
        assert await b.get_counts(tenant, "s", 0) == {"requests": 2, "tokens": 80, "last": 3}
        assert await a.get_counts(tenant, "s", 1) == {"requests": 1, "tokens": -5}
        assert await b.get_tenant_counts(tenant) == {"requests": 3, "tokens": 75}
        # a session gone: the tenant still counts the request
        await a.add_counts(tenant, "gone", 0, {"requests": 1}, token="r4")
        assert (await a.get_tenant_counts(tenant))["requests"] == 4
        with pytest.raises(NotFound):
            await a.get_counts(tenant, "gone", 0)
        with pytest.raises(NotFound):
            await a.get_counts(tenant, "s", 2)
        with pytest.raises(ValueError, match="must be an int"):
            await a.add_counts(tenant, "s", 0, {"requests": 1.5}, token="r5")  # type: ignore[dict-item]
        assert await a.get_tenant_counts(f"{tenant}-other") == {}
    finally:
        await a.close()
        await b.close()


async def test_counting_appends_one_log_record_per_token(
    make_store: StoreFactory, tenant: str
) -> None:
    a, b = make_store(), make_store()
    try:
        await a.ingest(tenant, "s", history(2))
        await a.ingest(tenant, "s", [*history(1), msg("assistant", "fork")])
        assert await a.get_log(tenant, "s", 0) == []
        await a.add_counts(tenant, "s", 0, {"requests": 1}, token="r1", record=b"first")
        await b.add_counts(tenant, "s", 0, {"requests": 1}, token="r1", record=b"first")  # retry
        await b.add_counts(tenant, "s", 0, {"requests": 1}, token="r2", record=b"first")  # equal
        await a.add_counts(tenant, "s", 1, {"requests": 1}, token="r3", record=b"fork")
        await a.add_counts(tenant, "s", 0, {"requests": 1}, token="r4")  # no record
        assert await b.get_log(tenant, "s", 0) == [b"first", b"first"]
        assert await a.get_log(tenant, "s", 1) == [b"fork"]
        with pytest.raises(NotFound):
            await a.get_log(tenant, "s", 2)
        with pytest.raises(NotFound):
            await a.get_log(tenant, "gone", 0)
    finally:
        await a.close()
        await b.close()


async def test_64_concurrent_counts_all_land(make_store: StoreFactory, tenant: str) -> None:
    replicas = [make_store(), make_store()]
    try:
        await replicas[0].ingest(tenant, "s", history(2))
        await asyncio.gather(
            *(
                replicas[i % 2].add_counts(tenant, "s", 0, {"requests": 1}, token=f"req-{i}")
                for i in range(64)
            )
        )
        assert await replicas[1].get_counts(tenant, "s", 0) == {"requests": 64}
    finally:
        for r in replicas:
            await r.close()


async def test_charges_hold_their_limits_across_stores(
    make_store: StoreFactory, tenant: str
) -> None:
    a, b = make_store(), make_store()
    minute = 60.0
    try:

        def take(tokens: int) -> list[Charge]:
            return [Charge("req", 1, 3, minute), Charge("tok", tokens, 100, minute)]

        assert await a.charge(tenant, take(60)) is None
        # all or nothing: the token charge fails, so the request is not counted either
        assert await b.charge(tenant, take(50)) == Refusal("tok", 60, 100)
        assert await b.charge(tenant, take(40)) is None
        assert await a.charge(tenant, [Charge("tok", 0, 100, minute)]) == Refusal("tok", 100, 100)
        assert await a.charge(tenant, take(0)) == Refusal("tok", 100, 100)
        assert await a.charge(tenant, [Charge("req", 1, 3, minute)]) is None
        assert await b.charge(tenant, [Charge("req", 1, 3, minute)]) == Refusal("req", 3, 3)
        # another tenant has counters of its own; a short window starts over
        assert await a.charge(f"{tenant}-b", take(100)) is None
        assert await a.charge(tenant, [Charge("fast", 1, 1, 0.3)]) is None
        assert await a.charge(tenant, [Charge("fast", 1, 1, 0.3)]) is not None
        await asyncio.sleep(0.35)
        assert await a.charge(tenant, [Charge("fast", 1, 1, 0.3)]) is None
    finally:
        await a.close()
        await b.close()


async def test_a_gauge_goes_up_and_down(store: SessionStore, tenant: str) -> None:
    results = await asyncio.gather(
        *(store.charge(tenant, [Charge("inflight", 1, 4)]) for _ in range(10))
    )
    assert sum(r is None for r in results) == 4
    assert await store.charge(tenant, [Charge("inflight", -1)]) is None
    assert await store.charge(tenant, [Charge("inflight", 1, 4)]) is None
    assert await store.charge(tenant, [Charge("inflight", 1, 4)]) == Refusal("inflight", 4, 4)
    for _ in range(6):  # more releases than holds never go below zero
        await store.charge(tenant, [Charge("inflight", -1)])
    assert await store.charge(tenant, [Charge("inflight", 4, 4)]) is None


async def test_session_count_limit(store: SessionStore, tenant: str) -> None:
    await store.ingest(tenant, "a", history(2))
    await store.ingest(tenant, "b", history(2))
    req = [Charge("req", 1)]
    assert await store.charge(tenant, req, session="a", max_sessions=2) is None  # a live one
    assert await store.charge(tenant, req, session="c", max_sessions=2) == Refusal("sessions", 2, 2)
    assert await store.charge(tenant, req, session="c", max_sessions=3) is None
    await store.delete_session(tenant, "b")
    assert await store.charge(tenant, req, session="c", max_sessions=2) is None


async def until_taken(charge: Callable[[], Awaitable[Refusal | None]], bound_s: float) -> float:
    """Repeat ``charge`` until it is taken; the seconds that took (fails past ``bound_s``)."""
    started = time.monotonic()
    while await charge() is not None:
        assert time.monotonic() - started < bound_s, f"not taken within {bound_s} s"
        await asyncio.sleep(0.02)
    return time.monotonic() - started


def claim(lease_id: str, limit: int = 2, period_s: float = 30.0) -> LeaseClaim:
    return LeaseClaim("slots", lease_id, limit, period_s)


async def test_leases_hold_their_limit_across_stores_and_run_out(
    make_store: StoreFactory, tenant: str
) -> None:
    a, b = make_store(), make_store()
    period = 1.0
    try:
        assert await a.charge(tenant, [], lease=claim("l1", period_s=period)) is None
        assert await b.charge(tenant, [], lease=claim("l2", period_s=period)) is None
        assert await a.charge(tenant, [], lease=claim("l1", period_s=period)) is None  # again
        refused = await b.charge(tenant, [Charge("req", 1, 1, 60.0)], lease=claim("l3"))
        assert refused is not None and refused.name == "slots"
        assert (refused.current, refused.limit) == (2, 2)
        assert refused.free_in_s is not None and 0 <= refused.free_in_s <= period
        # all or nothing: the refused claim did not count the request either
        assert await b.charge(tenant, [Charge("req", 1, 1, 60.0)]) is None
        # another tenant's pool is its own
        assert await a.charge(f"{tenant}-b", [], lease=claim("l1", limit=1)) is None
        # nobody renews l1 and l2: their slots come back within the period
        waited = await until_taken(
            lambda: b.charge(tenant, [], lease=claim("l3", period_s=period)), 5.0
        )
        assert waited <= period + 0.5, waited
        assert await a.renew_leases([HeldLease(tenant, "slots", "l1")], period) == [
            HeldLease(tenant, "slots", "l1")  # ran out: gone for good
        ]
    finally:
        await a.close()
        await b.close()


async def test_renewed_leases_outlive_their_period_and_released_ones_stay_gone(
    make_store: StoreFactory, tenant: str
) -> None:
    a, b = make_store(), make_store()
    period = 0.4
    held = [HeldLease(tenant, "slots", "l1"), HeldLease(tenant, "slots", "l2")]
    other = HeldLease(f"{tenant}-b", "slots", "l1")
    try:
        assert await a.charge(tenant, [], lease=claim("l1", period_s=period)) is None
        assert await a.charge(other.tenant, [], lease=claim("l1", 1, period)) is None
        assert await b.charge(tenant, [], lease=claim("l2", period_s=period)) is None
        started = time.monotonic()
        while time.monotonic() - started < 3 * period:  # renewed well past the period
            assert await a.renew_leases([*held, other], period) == []  # any tenants at once
            assert (await b.charge(tenant, [], lease=claim("l3"))) is not None
            assert (await b.charge(other.tenant, [], lease=claim("l3", 1))) is not None
            await asyncio.sleep(period / 4)
        await b.release_lease(held[0])
        await a.release_lease(held[0])  # again: nothing happens
        await a.release_lease(HeldLease(tenant, "slots", "never-held"))
        # a renewal racing the release does not bring the lease back
        assert await a.renew_leases(held, period) == [held[0]]
        assert await b.charge(tenant, [], lease=claim("l3", period_s=period)) is None
        assert await b.charge(tenant, [], lease=claim("l4")) is not None
        assert await a.renew_leases([], period) == []
    finally:
        await a.close()
        await b.close()


async def test_a_refused_claim_says_when_the_earliest_lease_runs_out(
    store: SessionStore, tenant: str
) -> None:
    assert await store.charge(tenant, [], lease=claim("long", period_s=20.0)) is None
    assert await store.charge(tenant, [], lease=claim("short", period_s=5.0)) is None
    refused = await store.charge(tenant, [], lease=claim("third"))
    assert refused is not None and refused.free_in_s is not None
    assert 4.0 < refused.free_in_s <= 5.0
    # renewed: the earliest deadline is the other lease's now
    assert await store.renew_leases([HeldLease(tenant, "slots", "short")], 40.0) == []
    refused = await store.charge(tenant, [], lease=claim("third"))
    assert refused is not None and refused.free_in_s is not None
    assert 19.0 < refused.free_in_s <= 20.0


async def test_the_gauge_of_an_earlier_version_takes_no_slot(
    store: SessionStore, tenant: str
) -> None:
    """Requests in flight were once the gauge "concurrent": a store holding one at its limit
    (left by a crashed process) admits requests, which hold leases now."""
    assert await store.charge(tenant, [Charge("concurrent", 5)]) is None
    lease = LeaseClaim("concurrent", "l1", 1, 30.0)
    assert await store.charge(tenant, [], lease=lease) is None
    refused = await store.charge(tenant, [], lease=LeaseClaim("concurrent", "l2", 1, 30.0))
    assert refused is not None and refused.current == 1
