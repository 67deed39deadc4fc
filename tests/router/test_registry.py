"""The registration table: every policy is a composition of registered parts, and a new
part is usable by its registration alone."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from router import (
    POLICY_NAMES,
    SIMULATED_POLICY_NAMES,
    Knobs,
    ReplicaMetrics,
    get_preset,
    make_policy,
    registry,
)
from router.inputs import Candidate, RouteContext
from router.registry import POLICIES, PolicySpec, ProfileSpec
from tests.router.support import NoStore, static_pool


def test_every_policy_is_made_of_registered_parts() -> None:
    # The gateway offers its own four; the simulator also runs vllm-router's three.
    assert POLICY_NAMES == ("least_loaded", "round_robin", "sticky", "sticky_cost")
    assert (
        SIMULATED_POLICY_NAMES
        == tuple(sorted(POLICIES))
        == tuple(sorted((*POLICY_NAMES, "cache_aware", "consistent_hash", "sticky_least_loaded")))
    )
    knobs = Knobs(cost=get_preset("cpu-tiny"))
    for name, spec in POLICIES.items():
        for profile in (spec.new, spec.bound):
            if profile is None:
                continue
            assert profile.picker in registry.PICKERS, name
            assert set(profile.filters) <= set(registry.FILTERS), name
            assert {s for s, _ in profile.scorers} <= set(registry.SCORERS), name
            profile.build(knobs)  # every part builds from the knobs


@dataclass(frozen=True, slots=True)
class FreeKvScorer:
    """A scorer as a new module would add it: the free share of each replica's KV pool."""

    @classmethod
    def from_knobs(cls, knobs: Knobs) -> FreeKvScorer:
        return cls()

    def score(self, ctx: RouteContext, candidates: Sequence[Candidate]) -> list[float]:
        return [1.0 - (c.kv_usage or 0.0) for c in candidates]


async def test_a_registered_scorer_is_usable_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry.SCORERS, "free_kv", FreeKvScorer.from_knobs)
    spec = PolicySpec(
        new=ProfileSpec(scorers=(("free_kv", 1.0),)),
        bound=ProfileSpec(scorers=(("free_kv", 1.0), ("affinity", 1.0))),
        moved_reason="kv_full",
    )
    monkeypatch.setitem(POLICIES, "most_free_kv", spec)
    policy = make_policy("most_free_kv", assignments=_Store(), rehome_margin=0.2)
    pool = static_pool([0, 0, 0])
    for replica, used in zip(pool.replicas, (0.6, 0.2, 0.5), strict=True):
        replica.metrics = ReplicaMetrics(running=0, waiting=0, kv_cache_usage=used)
    _, b, c = pool.replicas
    # Equal loads would rotate over all three; the scorer sends every new session to b.
    assert {(await policy.choose("t", f"s{i}", pool)).replica for i in range(3)} == {b}
    # A bound session keeps b within the margin and moves past it, under the spec's reason.
    b.metrics = ReplicaMetrics(running=0, waiting=0, kv_cache_usage=0.6)  # 0.4 + 0.2 > 0.5
    assert (await policy.choose("t", "s0", pool)).reason == "sticky"
    b.metrics = ReplicaMetrics(running=0, waiting=0, kv_cache_usage=0.9)  # 0.1 + 0.2 < 0.5
    moved = await policy.choose("t", "s0", pool)
    assert (moved.replica, moved.reason, moved.moved_from) == (c, "kv_full", b.url)


def test_a_missing_knob_names_the_policy() -> None:
    with pytest.raises(ValueError, match="routing policy 'sticky_cost' needs a cost model"):
        make_policy("sticky_cost", assignments=NoStore())


class _Store:
    def __init__(self) -> None:
        self.map: dict[tuple[str, str], str] = {}

    async def get_assignment(self, tenant: str, session: str) -> str | None:
        return self.map.get((tenant, session))

    async def set_assignment(
        self, tenant: str, session: str, replica: str, *, expected: str | None, ttl_s: float
    ) -> str:
        self.map[(tenant, session)] = replica
        return replica
