"""The routing parts as pure functions, and the cost-aware sticky policy built from them."""

from __future__ import annotations

import pytest

from router import (
    AssignedSessionPolicy,
    AssignmentStore,
    ReplicaMetrics,
    RouteHints,
    RoutingPolicy,
    make_policy,
)
from router.cost import CostModel, get_preset
from router.filters.queue_slack import QueueSlackFilter
from router.inputs import Candidate, RouteContext
from router.pickers.max_score import MaxScorePicker
from router.scorers.cached_prefix import CachedPrefixScorer
from router.scorers.fit import FitScorer
from router.scorers.prefix import PrefixScorer
from router.scorers.queue_wait import QueueWaitScorer, queue_wait_s
from tests.router.support import static_pool

# Round numbers, so the expected seconds are computable by hand: 1 ms per prefill token,
# 10 ms per step, budget 1000 tokens.
COST = CostModel(
    name="test",
    per_step_s=0.01,
    per_prefill_token_s=0.001,
    per_decode_seq_s=0.0,
    per_attended_token_s=0.0,
    kv_bytes_per_token=1,
    kv_pool_tokens=1_000_000,
    block_size=16,
    max_num_batched_tokens=1000,
    max_num_seqs=64,
)


def cand(
    url: str, *, waiting: float = 0, running: float = 0, kv: float | None = 0.1, bound: int = 0
):
    return Candidate(url, running, waiting, 0, kv, bound)


def ctx(current: str | None = None, turn: int = 0, **hints: object) -> RouteContext:
    return RouteContext("t", "s", RouteHints(**hints), current=current, turn=turn)  # type: ignore[arg-type]


def test_cost_model_prefill_counts_budget_sized_steps() -> None:
    assert COST.prefill_s(0) == 0
    assert COST.prefill_s(2500) == pytest.approx(3 * 0.01 + 2.5)


def test_queue_wait_grows_with_queue_and_with_a_full_pool() -> None:
    idle, queued = cand("a"), cand("b", waiting=3)
    assert queue_wait_s(idle, COST, 500, 100) == 0
    assert queue_wait_s(queued, COST, 500, 100) == pytest.approx(3 * (0.01 + 0.5))
    full = cand("c", running=4, kv=0.99)
    assert queue_wait_s(full, COST, 500, 100) == pytest.approx(0.01 * 100 / 2)
    # In-flight requests the last scrape cannot have seen count as queued.
    unseen = Candidate("d", running=1, waiting=0, in_flight=3, kv_usage=0.1, bound_sessions=0)
    assert unseen.queued == 2


def test_queue_wait_counts_the_prefill_this_gateway_sized_and_the_rest_as_typical() -> None:
    # Two requests this gateway sent and sized (one re-prefill of 4,000 tokens, one new turn
    # of 200), and a third queued there that it did not size (another gateway's).
    sized = Candidate(
        "a", running=1, waiting=3, in_flight=3, kv_usage=0.1, bound_sessions=0,
        prefilling=2, prefill_backlog_tokens=4200,
    )  # fmt: skip
    assert queue_wait_s(sized, COST, 500, 100) == pytest.approx(
        COST.prefill_s(4200) + COST.prefill_s(500)
    )
    # One re-prefill queued weighs more than three new turns; by the count alone it would
    # weigh a third of them.
    one_long = Candidate("b", 1, 1, 1, 0.1, 0, prefilling=1, prefill_backlog_tokens=4000)
    three_short = Candidate("c", 1, 3, 3, 0.1, 0, prefilling=3, prefill_backlog_tokens=600)
    assert queue_wait_s(one_long, COST, 500, 100) > queue_wait_s(three_short, COST, 500, 100)
    # Nothing sized (no KV events): the count, as before.
    unsized = Candidate("d", 1, 3, 3, 0.1, 0)
    assert queue_wait_s(unsized, COST, 500, 100) == pytest.approx(3 * (0.01 + 0.5))


def test_queue_wait_scorer_prefers_the_shorter_queue() -> None:
    scores = QueueWaitScorer(COST, 500, 100).score(ctx(), [cand("a", waiting=2), cand("b")])
    assert scores[1] > scores[0]


def test_cached_prefix_scorer_prices_the_sessions_replica_only() -> None:
    scorer = CachedPrefixScorer(COST, hysteresis=0.5, min_gain_s=0.1)
    c = ctx("a", prompt_tokens=4000, cached_prefix_tokens=2000)
    a, b = scorer.score(c, [cand("a"), cand("b")])
    assert b == 0
    assert a == pytest.approx(COST.prefill_s(2000) * 1.5 + 0.1)
    # Unknown cached prefix: the prompt is taken as cached there.
    a_unknown, _ = scorer.score(ctx("a", prompt_tokens=4000), [cand("a"), cand("b")])
    assert a_unknown == pytest.approx(COST.prefill_s(4000) * 1.5 + 0.1)


def test_prefix_scorer_prefers_the_shared_prefix_but_not_twice() -> None:
    scorer = PrefixScorer(COST)
    away = RouteContext("t", "s", RouteHints(prefix_tokens=1000), current="a", prefix_home="b")
    scores = scorer.score(away, [cand("a"), cand("b"), cand("c")])
    assert scores == [0.0, pytest.approx(COST.prefill_s(1000)), 0.0]
    # On the session's own replica the cached-prefix scorer prices it already.
    home = RouteContext("t", "s", RouteHints(prefix_tokens=1000), current="a", prefix_home="a")
    assert scorer.score(home, [cand("a"), cand("b")]) == [0.0, 0.0]


def test_fit_scorer_prefers_free_kv_then_fewer_bound_sessions() -> None:
    scores = FitScorer().score(
        ctx(), [cand("a", kv=0.8), cand("b", kv=0.2, bound=5), cand("c", kv=0.2, bound=1)]
    )
    assert scores.index(max(scores)) == 2


def test_queue_slack_filter_keeps_near_shortest_queues() -> None:
    f = QueueSlackFilter(COST, 500, 100, slack_s=0.6)
    kept = f.filter(ctx(), [cand("a"), cand("b", waiting=1), cand("c", waiting=2)])
    assert [c.url for c in kept] == ["a", "b"]


def test_max_score_picker_keeps_the_current_replica_on_a_tie() -> None:
    picker = MaxScorePicker()
    pool = [cand("a"), cand("b")]
    kept = [picker.pick(ctx("b", turn=t), pool, [1.0, 1.0]) for t in range(4)]
    assert {(p.candidate.url, p.turned) for p in kept} == {("b", False)}
    # Other ties rotate: the turn the policy passes in says whose it is.
    rotated = [picker.pick(ctx(turn=t), pool, [1.0, 1.0]) for t in range(4)]
    assert [p.candidate.url for p in rotated] == ["b", "a", "b", "a"]
    assert all(p.turned for p in rotated)
    assert picker.pick(ctx(turn=1), pool, [2.0, 1.0]).candidate.url == "a"


def sticky_cost(assignments: AssignmentStore) -> RoutingPolicy:
    """``sticky_cost`` pricing with ``COST``, a typical request of 500 tokens in, 100 out."""
    return make_policy(
        "sticky_cost",
        assignments=assignments,
        cost=COST,
        typical_prefill_tokens=500,
        typical_output_tokens=100,
    )


def busy(waiting: float, kv: float = 0.2) -> ReplicaMetrics:
    return ReplicaMetrics(running=1, waiting=waiting, kv_cache_usage=kv)


async def test_sticky_cost_keeps_a_long_session_through_a_short_queue(
    assignments: AssignmentStore,
) -> None:
    pool = static_pool([0, 0])
    a, b = pool.replicas
    policy = sticky_cost(assignments)
    first = await policy.choose("t", "s", pool, hints=RouteHints(prompt_tokens=1000))
    assert first.reason == "new"
    home, other = (a, b) if first.replica is a else (b, a)
    # 4 waiting there (~2 s) vs re-prefilling 20k cached tokens elsewhere (~20 s): stay.
    home.metrics = busy(4)
    hints = RouteHints(prompt_tokens=21_000, cached_prefix_tokens=20_000)
    again = await policy.choose("t", "s", pool, hints=hints)
    assert (again.replica, again.reason) == (home, "sticky")
    # A queue worth more than the re-prefill moves it, and records the move.
    home.metrics = busy(60)
    moved = await policy.choose("t", "s", pool, hints=hints)
    assert (moved.replica, moved.reason, moved.moved_from) == (other, "queue_cost", home.url)
    assert await assignments.get_assignment("t", "s") == other.url


async def test_sticky_cost_weighs_the_sized_prefill_queued_not_the_count(
    assignments: AssignmentStore,
) -> None:
    pool = static_pool([0, 0])
    a, b = pool.replicas
    policy = sticky_cost(assignments)
    await assignments.set_assignment("t", "s", a.url, expected=None, ttl_s=60)
    # The KV events say a holds 2,000 of the session's prompt (~2 s of prefill saved there).
    hints = RouteHints(prompt_tokens=2100, cached_prefix_tokens=2000, resident_tokens={a.url: 2000})
    # One request queued on a, by the count ~0.5 s: the session stays...
    a.metrics, b.metrics = busy(1), busy(0)
    assert (await policy.choose("t", "s", pool, hints=hints)).replica is a
    # ...unless this gateway sent it and sized it: the re-prefill of another session's
    # 6,000 tokens (~6 s) is ahead of it on a, and moving costs its own ~2 s.
    a.started()
    with a.prefill(6000):
        moved = await policy.choose("t", "s", pool, hints=hints)
    assert (moved.replica, moved.reason) == (b, "queue_cost")
    a.ended()


def test_a_replica_counts_a_sized_prefill_while_its_block_runs() -> None:
    (replica,) = static_pool([0]).replicas
    with replica.prefill(2000):
        assert (replica.prefilling, replica.prefill_backlog_tokens) == (1, 2000)
        with pytest.raises(RuntimeError), replica.prefill(500):
            assert replica.prefill_backlog_tokens == 2500
            raise RuntimeError("the upstream failed before its first chunk")
        assert (replica.prefilling, replica.prefill_backlog_tokens) == (1, 2000)
    with replica.prefill(None):  # not sized (no KV events): nothing counted
        assert (replica.prefilling, replica.prefill_backlog_tokens) == (0, 0)
    assert (replica.prefilling, replica.prefill_backlog_tokens, replica.in_flight) == (0, 0, 0)


async def test_sticky_cost_hysteresis_stops_a_session_bouncing(
    assignments: AssignmentStore,
) -> None:
    pool = static_pool([0, 0])
    a, b = pool.replicas
    policy = make_policy(
        "sticky_cost",
        assignments=assignments,
        cost=COST,
        typical_prefill_tokens=500,
        typical_output_tokens=100,
        hysteresis=0.5,
    )
    await assignments.set_assignment("t", "s", a.url, expected=None, ttl_s=60)
    hints = RouteHints(prompt_tokens=2100, cached_prefix_tokens=2000)  # ~2 s of prefill
    # a's queue costs ~2.6 s more than b's: more than the 2 s re-prefill, less than 2 s
    # plus the 50% hysteresis. The session stays.
    a.metrics, b.metrics = busy(5), busy(0)
    assert (await policy.choose("t", "s", pool, hints=hints)).replica is a
    # Clearly worse: it moves once, and the same difference the other way keeps it on b.
    a.metrics = busy(12)
    assert (await policy.choose("t", "s", pool, hints=hints)).replica is b
    a.metrics, b.metrics = busy(0), busy(5)
    assert (await policy.choose("t", "s", pool, hints=hints)).replica is b


async def test_sticky_cost_new_sessions_go_where_they_fit(assignments: AssignmentStore) -> None:
    pool = static_pool([0, 0, 0])
    a, b, c = pool.replicas
    policy = sticky_cost(assignments)
    # Equal short queues; c has the most free KV. b has a long queue despite free KV.
    a.metrics, b.metrics, c.metrics = busy(0, kv=0.7), busy(20, kv=0.0), busy(0, kv=0.1)
    first = await policy.choose("t", "s1", pool, hints=RouteHints(prompt_tokens=100))
    assert first.replica is c
    # Same free KV everywhere it fits: the replica with fewer sessions bound wins.
    a.metrics = busy(0, kv=0.1)
    second = await policy.choose("t", "s2", pool, hints=RouteHints(prompt_tokens=100))
    assert second.replica is a


async def test_sticky_cost_sends_a_new_session_of_an_agent_to_its_prefix(
    assignments: AssignmentStore,
) -> None:
    pool = static_pool([0, 0, 0])
    policy = sticky_cost(assignments)
    for r in pool.replicas:
        r.metrics = busy(0)
    agent = RouteHints(prefix_key="agent-1", prefix_tokens=3000)
    first = await policy.choose("t", "a1", pool, hints=agent)
    second = await policy.choose("t", "a2", pool, hints=agent)
    assert second.replica is first.replica


def test_presets_are_consistent() -> None:
    h200 = get_preset("h200-qwen3.6-27b")
    assert h200.kv_bytes_per_token == 65_536
    assert 500_000 < h200.kv_pool_tokens < 2_000_000
    # ~9k prefill tokens/s and ~13 ms per decode step for a 27B model on one H200.
    assert 5_000 < 1 / h200.per_prefill_token_s < 15_000
    assert 0.01 < h200.step_s(0, 1, 0) < 0.02
    with pytest.raises(ValueError, match="unknown cost preset"):
        get_preset("nope")


def test_make_policy_builds_sticky_cost_with_a_cost_model(assignments: AssignmentStore) -> None:
    policy = make_policy("sticky_cost", assignments=assignments, cost=COST)
    assert isinstance(policy, AssignedSessionPolicy) and policy.knobs.cost is COST
    with pytest.raises(ValueError, match="needs a cost model"):
        make_policy("sticky_cost", assignments=assignments)
