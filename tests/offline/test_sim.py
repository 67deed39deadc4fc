"""The cluster simulator: the block pool, one replica's scheduler, and whole runs."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from gateway.cli import main
from gateway.tokens import ByteEstimate, ChatTokenizer
from offline.importers import MessageTime, load_trajectories
from offline.prefix_cache import BlockPool
from offline.replay import ReplayConfig
from offline.sim.calibrate import decode_phase, fit_coefficients, prefill_phase
from offline.sim.cli import scaled
from offline.sim.cluster import SimConfig, simulate
from offline.sim.compare import bucket_bound, read_experiment
from offline.sim.engine import SimReplica, SimRequest
from offline.sim.judge import judge
from offline.sim.judge import markdown as judgement_markdown
from offline.sim.offload import OffloadTier
from offline.sim.ordering import ordered_pairs, ordering, simulated_pairs
from offline.sim.result import CellResult
from offline.sim.serving_path import ServedRequest, fit_serving_path, token_interval
from offline.sim.workload import build_workload
from router import make_policy
from router.admission_seam import AdmissionRequest, AdmissionVerdict, AdmitAll
from router.cost import CostModel, get_preset
from router.knobs import ADMISSION_MAX_WAIT_S
from router.registry import ADMISSIONS


def ids(*xs: int) -> np.ndarray:
    return np.asarray(xs, dtype=np.int64)


def test_block_pool_never_evicts_held_blocks_and_evicts_lru_released_ones() -> None:
    pool = BlockPool(4, n_ids=10, evict_batch=1)
    assert pool.acquire(ids(0, 1, 2))
    assert not pool.acquire(ids(3, 4))  # 3 held + 2 > 4: refused, nothing changed
    assert (pool.used, pool.cached) == (3, 3)
    pool.release(ids(0, 1, 2))  # block 0 most recent: prompts' beginnings go last
    assert (pool.used, pool.usage) == (0, 0.0)  # cached but unreferenced counts free
    assert pool.hits(ids(0, 1, 2), 3) == 3
    assert pool.acquire(ids(5, 6))  # one never-used slot, then evicts block 2 (LRU)
    assert pool.hits(ids(0, 1, 2), 3) == 2
    assert pool.acquire(ids(0, 1))  # cached: reused, no slot needed
    assert pool.usage == 1.0
    assert not pool.acquire(ids(7)) and not pool.acquire(ids(), anonymous=1)
    pool.release(ids(0, 1))
    assert pool.acquire(ids(), anonymous=2)  # evicts the released blocks 0 and 1
    assert pool.hits(ids(0, 1, 2), 3) == 0


def cost(**changes: float) -> CostModel:
    base = dict(
        name="test",
        per_step_s=0.01,
        per_prefill_token_s=0.001,
        per_decode_seq_s=0.0,
        per_attended_token_s=0.0,
        kv_bytes_per_token=1,
        kv_pool_tokens=1600,
        block_size=16,
        max_num_batched_tokens=256,
        max_num_seqs=8,
    )
    return CostModel(**(base | changes))  # type: ignore[arg-type]


def request(
    n_blocks: int, start: int = 0, *, prompt: int | None = None, out: int = 4
) -> SimRequest:
    prompt = n_blocks * 16 + 5 if prompt is None else prompt
    return SimRequest(0, 0, np.arange(start, start + n_blocks), prompt, out, arrival=0.0)


def run_until_idle(replica: SimReplica, now: float = 0.0) -> tuple[float, int]:
    steps = 0
    end = replica.start_step(now)
    while end is not None:
        replica.finish_step(end)
        steps += 1
        now = end
        end = replica.start_step(now)
    return now, steps


def test_chunked_prefill_respects_the_token_budget() -> None:
    replica = SimReplica.create(0, cost())
    replica.pool.ensure(100)
    req = request(40)  # 645 tokens, 256 per step: 3 prefill steps, then decode
    replica.add(req)
    end = replica.start_step(0.0)
    assert end == pytest.approx(0.01 + 0.256)
    replica.finish_step(end)
    assert req.computed == 256 and req.first_token is None
    run_until_idle(replica, end)
    assert req.first_token is not None and req.finished is not None
    assert replica.stats.prefix_queries == 645 and replica.stats.prefix_hits == 0


def test_a_sessions_next_request_hits_its_cached_prefix() -> None:
    replica = SimReplica.create(0, cost())
    replica.pool.ensure(100)
    replica.add(request(10))
    now, _ = run_until_idle(replica)
    nxt = request(14)  # extends the first prompt by 4 blocks
    replica.add(nxt)
    run_until_idle(replica, now)
    assert nxt.cached_tokens == 10 * 16


def test_a_full_pool_preempts_the_last_request_by_recompute() -> None:
    # 100 blocks; two requests of 45 prompt blocks each, long outputs: decoding grows them
    # past the pool, so the later one is preempted and later resumes from its cached blocks.
    replica = SimReplica.create(0, cost(max_num_batched_tokens=2048))
    replica.pool.ensure(200)
    first, second = request(45, 0, out=200), request(45, 100, out=200)
    replica.add(first)
    replica.add(second)
    run_until_idle(replica)
    assert first.finished is not None and second.finished is not None
    assert replica.stats.preemptions >= 1 and second.preemptions >= 1
    assert first.preemptions == 0
    # As in vLLM, the preempted request's second lookup (which finds its own blocks) is
    # not in the prefix-cache counters: each request is queried once, with no hits.
    assert replica.stats.prefix_queries == first.prompt_tokens + second.prompt_tokens
    assert replica.stats.prefix_hits == 0
    assert replica.pool.used == 0


def test_priority_scheduling_preempts_the_highest_value_and_queues_by_priority() -> None:
    # The same two requests as above, the first one (arrived first) at priority 1, the
    # second at 0: under priority scheduling the first is the victim (highest value),
    # where fcfs preempts the last; waiting requests are taken lower value first.
    replica = SimReplica.create(0, cost(max_num_batched_tokens=2048), priority=True)
    replica.pool.ensure(400)
    first, second = request(45, 0, out=200), request(45, 100, out=200)
    first.priority = 1
    replica.add(first)
    replica.add(second)
    assert list(replica.waiting) == [second, first]  # (priority, arrival)
    run_until_idle(replica)
    assert first.finished is not None and second.finished is not None
    assert first.preemptions >= 1 and second.preemptions == 0
    late_low, late_high = request(2, 300), request(2, 320)
    late_low.priority, late_high.priority = 3, 0
    replica.add(late_low)
    replica.add(late_high)
    assert list(replica.waiting) == [late_high, late_low]


def test_a_request_is_admitted_only_when_its_whole_prompt_fits() -> None:
    # 100 blocks. The first request holds 61; the second's first chunk (16 blocks) would
    # fit, its whole prompt (51 blocks) does not: it waits, as vLLM's admission gate makes
    # it, instead of being admitted and preempting its way through.
    replica = SimReplica.create(0, cost())
    replica.pool.ensure(200)
    first, second = request(60, 0, out=20), request(50, 100, out=2)
    replica.add(first)
    replica.add(second)
    run_until_idle(replica)
    assert replica.stats.preemptions == 0
    assert second.first_scheduled is not None and first.finished is not None
    assert second.first_scheduled >= first.finished


def tiered(**changes: float) -> CostModel:
    """``cost()`` with a CPU offload tier of 200 blocks; a block reloads in 16 ms."""
    base = dict(kv_bytes_per_token=1000, offload_tokens=200 * 16, offload_bytes_per_s=1e6)
    return cost(**(base | changes))


def fill_gpu_then_return(replica: SimReplica) -> tuple[SimRequest, float]:
    """A session's first request (10 prompt blocks), then another session's long prompt
    that evicts part of it from the GPU pool (99 blocks), then the first session's next
    request, 4 blocks longer, added at the returned time."""
    replica.ensure(400)
    replica.add(request(10, 0))
    now, _ = run_until_idle(replica)
    replica.add(request(95, 100, out=1))
    now, _ = run_until_idle(replica, now)
    back = request(14, 0)
    back.arrival = now
    replica.add(back)
    return back, now


def test_a_prefix_the_gpu_evicted_is_loaded_from_the_offload_tier_not_prefilled() -> None:
    replica = SimReplica.create(0, tiered())
    back, now = fill_gpu_then_return(replica)
    assert replica.tier is not None
    on_gpu = replica.pool.hits(back.ids, 14)
    in_tier = replica.tier.hits(back.ids[on_gpu:14])
    assert on_gpu < 10 and on_gpu + in_tier == 10  # written through as computed
    queried, hits = replica.stats.prefix_queries, replica.stats.prefix_hits
    # It loads the tier's blocks (16 ms each, 1000 bytes a token at 1 MB/s) and computes
    # nothing until the load is done: the replica idles until then.
    load_s = in_tier * 16 * 1000 / 1e6
    wake = replica.start_step(now)
    assert wake == pytest.approx(now + load_s)
    assert back.first_scheduled is None and replica.loading == [back]
    replica.finish_step(wake)
    end = replica.start_step(wake)
    # Then it prefills only what neither held: 4 blocks and the partial one, 69 tokens.
    assert end == pytest.approx(wake + 0.01 + 0.001 * (14 * 16 + 5 - 160))
    assert back.first_scheduled == wake
    run_until_idle(replica, wake)
    assert back.cached_tokens == 160 and back.first_token == pytest.approx(end)
    # vLLM's counters: the GPU's hit in the prefix cache's, the load in the connector's.
    assert replica.stats.prefix_queries - queried == back.prompt_tokens
    assert replica.stats.prefix_hits - hits == on_gpu * 16
    assert replica.stats.external_hits == in_tier * 16
    # Without a tier the same requests re-prefill what the GPU evicted.
    plain = SimReplica.create(0, cost(kv_bytes_per_token=1000))
    again, now = fill_gpu_then_return(plain)
    run_until_idle(plain, now)
    assert again.cached_tokens == on_gpu * 16 and plain.tier is None


def test_a_request_loading_from_the_offload_tier_waits_while_others_run() -> None:
    # vLLM admits a request with a tier hit to load and considers the next waiting one in
    # the same step: the load holds up nobody behind it.
    replica = SimReplica.create(0, tiered(offload_bytes_per_s=1e4))  # 1.6 s a block
    back, now = fill_gpu_then_return(replica)
    other = request(2, 300, out=2)
    other.arrival = now
    replica.add(other)
    replica.start_step(now)
    assert replica.loading == [back] and other.first_scheduled == now
    run_until_idle(replica, now)
    assert other.finished is not None and back.first_scheduled is not None
    assert other.finished < back.ready_at <= back.first_scheduled


def test_the_offload_tier_keeps_its_capacity_and_evicts_the_least_recently_used() -> None:
    tier = OffloadTier(4)
    tier.ensure(10)
    assert tier.store(ids(0, 1)) and tier.store(ids(2, 3))
    assert tier.pool.cached == 4
    # A store evicts what was used least recently: of each store, the last block first
    # (a prompt's beginning is the most recent, as vLLM's LRU ranks it).
    assert tier.store(ids(4))
    assert tier.pool.cached == 4 and tier.hits(ids(0, 1)) == 1
    tier.touch(ids(2, 3))  # a request that used 2 and 3 finished: 0 is now the oldest
    assert tier.store(ids(5))
    assert (tier.hits(ids(0)), tier.hits(ids(2, 3)), tier.hits(ids(4, 5))) == (0, 2, 2)
    # Blocks a load reads are not evicted; a store that cannot make room stores nothing.
    tier.pin(ids(2, 3, 4, 5))
    assert not tier.store(ids(6)) and tier.stores_skipped == 1
    assert tier.hits(ids(6)) == 0 and tier.hits(ids(2, 3)) == 2
    tier.unpin(ids(2, 3, 4, 5))
    assert tier.store(ids(6)) and tier.pool.cached == 4
    # A store never evicts a block it offers itself.
    assert tier.store(ids(6, 7, 8, 9)) and tier.hits(ids(6, 7, 8, 9)) == 4


def test_an_offload_tier_changes_nothing_while_the_gpu_pool_evicts_nothing(
    tmp_path: Path,
) -> None:
    # With a pool that never evicts, every prefix hits on the GPU: the tier only stores, and
    # every figure but its own is the run without it. With a pool that evicts, the tier
    # turns re-prefills into loads.
    workload = build_workload(
        load_trajectories(trajectory_file(tmp_path)),
        ChatTokenizer(ByteEstimate()),
        ReplayConfig(strategies=("base",), block_size=16),
    )

    def run(model: CostModel) -> dict[str, Any]:
        config = SimConfig(policy="sticky_cost", strategy="base", cost=model, replicas=2,
                           concurrency=6, duration_s=120, warmup_s=10, think_s=1.0)  # fmt: skip
        return simulate(workload, config).summary()

    link = dict(kv_bytes_per_token=1000, offload_bytes_per_s=1e9)
    roomy = cost(kv_pool_tokens=200_000, **link)
    plain, tier = run(roomy), run(roomy.with_offload(10**9))
    assert "offload_hit_rate" not in plain and tier.pop("offload_hit_rate") == 0.0
    assert tier == plain
    tight = cost(kv_pool_tokens=3_000, **link)
    plain, tier = run(tight), run(tight.with_offload(10**9))
    assert tier["offload_hit_rate"] > 0
    assert tier["prefix_hit_rate"] + tier["offload_hit_rate"] > plain["prefix_hit_rate"]


def test_kv_offloading_size_gives_the_replicas_and_the_gateway_one_tier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As an operator sets vLLM's --kv-offloading-size and the gateway's kv_offload_bytes
    # to the same bytes: the policy prices restores with the tier the engines run.
    import offline.sim.cluster as cluster

    priced: list[CostModel] = []

    def recording(name: str, **kwargs: Any) -> Any:
        priced.append(kwargs["cost"])
        return make_policy(name, **kwargs)

    monkeypatch.setattr(cluster, "make_policy", recording)

    def run(*extra: str) -> dict[str, Any]:
        return dict(json.loads((simulate_tiny(tmp_path, *extra) / "results.json").read_text()))

    plain, tiered_run = run(), run("--kv-offloading-size", "0.5")
    preset = get_preset("cpu-tiny")
    assert priced[0] == preset and priced[1] == preset.with_offload(2**29)
    assert priced[1].offload_tokens == 2**29 // preset.kv_bytes_per_token
    assert "kv offload tier per replica (tokens)" not in plain["setup"]
    assert tiered_run["setup"]["kv offload tier per replica (tokens)"] == f"{2**29 // 512:,}"
    assert "offload_hit_rate" not in plain["cells"][0]
    assert "offload_hit_rate" in tiered_run["cells"][0]


def test_streamed_tokens_lengthen_the_step_that_emits_them() -> None:
    # 2 requests of 10 blocks (165 tokens) under a 256 budget: step 1 prefills the first
    # (165) and 91 of the second; step 2 finishes the second and decodes the first.
    replica = SimReplica.create(0, cost(per_output_token_s=0.5))
    replica.pool.ensure(100)
    first, second = request(10, 0, out=3), request(10, 50, out=3)
    replica.add(first)
    replica.add(second)
    end = replica.start_step(0.0)
    assert end == pytest.approx(0.01 + 0.256 + 0.5)  # only the first emits its first token
    replica.finish_step(end)
    end2 = replica.start_step(end)
    assert end2 - end == pytest.approx(0.01 + 0.074 + 0.5 * 2)
    # A decode jump of n steps emits a token per running request per step.
    replica.finish_step(end2)
    end3 = replica.start_step(end2)
    assert end3 - end2 == pytest.approx(0.01 + 0.5 * 2)


def test_the_per_request_latency_delays_arrival_at_the_engine(tmp_path: Path) -> None:
    workload = build_workload(
        load_trajectories(trajectory_file(tmp_path, steps=2)),
        ChatTokenizer(ByteEstimate()),
        ReplayConfig(strategies=("base",), block_size=16),
    )

    def run(per_request_s: float) -> CellResult:
        c = cost(kv_pool_tokens=100_000, max_num_batched_tokens=4096, per_request_s=per_request_s)
        config = SimConfig(
            policy="sticky", strategy="base", cost=c, replicas=1, concurrency=1, sessions=1,
            think_s=0, duration_s=1_000, warmup_s=0,
        )  # fmt: skip
        return simulate(workload, config)

    direct, delayed = run(0.0), run(0.25)
    assert delayed.queue_s == direct.queue_s == [0.0] * 3  # time at the engine
    assert delayed.ttft_s == pytest.approx([t + 0.25 for t in direct.ttft_s])  # the client's
    # Fixed work: the window ends at the last reply (not at a scrape), so the 3 requests'
    # delays lengthen it by exactly theirs.
    assert delayed.requests == 3
    assert delayed.window_s == pytest.approx(direct.window_s + 0.75)


def test_serving_path_fit_recovers_the_terms_that_made_the_requests() -> None:
    engine = cost(per_step_s=0.01, per_prefill_token_s=1e-4, per_decode_seq_s=1e-3)
    engine = replace(engine, max_num_batched_tokens=2048)
    per_token, per_request = 0.03, 0.2
    decode = engine.per_step_s + engine.per_decode_seq_s + per_token  # one sequence per step
    requests = []
    t = 0.0
    for prompt, cached, out in [(1000, 0, 40), (3000, 900, 80), (500, 200, 20)]:
        prefill = engine.per_step_s + (prompt - cached) * engine.per_prefill_token_s
        first = t + per_request + prefill  # alone: no step in progress to wait for
        end = first + (out - 1) * decode
        requests.append(ServedRequest("r0", t, first, end, prompt, cached, out))
        t = end + 1.0
    # Two requests decoding side by side for their whole stretch on another replica.
    both = 2 * (engine.per_step_s + 2 * (engine.per_decode_seq_s + per_token))
    for _ in range(2):
        requests.append(ServedRequest("r1", 0.0, 1.0, 1.0 + 30 * both / 2, 800, 0, 31))
    # On a third replica, one request alone, and three sent while it still waited for its
    # first token: they queued (5 s), which is not the serving path's latency, and would
    # move the median if counted.
    prefill = engine.per_step_s + 400 * engine.per_prefill_token_s
    alone = 500.0 + per_request + prefill
    requests.append(ServedRequest("r2", 500.0, alone, alone + 0.01, 400, 0, 2))
    for k in range(3):
        sent = 500.0 + 0.001 * (k + 1)
        requests.append(ServedRequest("r2", sent, sent + 5.0, sent + 5.01, 400, 0, 2))
    fit = fit_serving_path(requests, engine)
    assert fit.per_output_token_s == pytest.approx(per_token, rel=0.02)
    assert fit.per_request_s == pytest.approx(per_request, rel=0.05)
    # Every stretch is what the terms predict: no spread around the model.
    assert fit.step_jitter == pytest.approx(0.0, abs=0.01) and fit.requests == 9
    # Stretches half as long again and half as short again as predicted spread by about
    # log(1.5) around it (the interquartile range of those logs over 1.349).
    spread = [replace(r, end=r.first_token + (r.end - r.first_token) * f)
              for r, f in zip(requests[:3], (1.5, 1.0, 1 / 1.5), strict=True)]  # fmt: skip
    jittered = fit_serving_path(spread, engine)
    assert 0.2 < jittered.step_jitter < 0.35
    with pytest.raises(ValueError, match="no request"):
        fit_serving_path([requests[0].__class__("r", 0, 1, 1, 10, 0, 1)], engine)


def test_cells_are_ordered_only_beyond_the_run_to_run_spread() -> None:
    # Cell 0 moved 0.5 between the runs, cell 1 0.8, cell 2 0.1.
    runs = [[1.0, 2.0, 3.0], [1.5, 1.2, 3.1]]
    assert ordered_pairs(runs) == [(0, 2, -1.0), (1, 2, -1.0)]  # 0 vs 1: a tie
    # Both runs put cell 1 above cell 0, but by less than cell 1 itself moves between
    # runs: a tie, not an order.
    assert ordered_pairs([[1.0, 2.0], [1.0, 1.2]]) == []
    assert ordered_pairs([[1.0, 2.0], [1.1, 2.2]]) == [(0, 1, -1.0)]
    # One run: no spread known, every unequal pair is ordered; equal ones are not.
    assert ordered_pairs([[1.0, 1.0, 2.0]]) == [(0, 2, -1.0), (1, 2, -1.0)]
    # The simulation orders a pair when its seeds' means differ by more than twice the
    # difference's standard error.
    assert simulated_pairs([[1.0, 2.0], [1.2, 2.2]]) == {(0, 1): -1.0}  # 1.0 > 2 * 0.14
    assert simulated_pairs([[1.0, 2.0], [2.0, 1.2]]) == {}  # 0.1 apart, error 0.64
    alike = ordering(runs, [[1.0, 1.5, 5.0], [1.2, 1.1, 5.5]])
    assert (alike.ordered, alike.alike, alike.opposite, alike.tied, alike.same) == (
        2, 2, 0, 0, True)  # fmt: skip
    swapped = ordering(runs, [[1.0, 4.0, 3.0]])  # 1 above 2: the runs put 2 above 1
    assert (swapped.alike, swapped.opposite, swapped.same) == (1, 1, False)
    tied = ordering(runs, [[1.0, 3.0, 2.0], [1.0, 2.0, 3.0]])  # the seeds disagree on 1 vs 2
    assert (tied.alike, tied.opposite, tied.tied, tied.same) == (1, 0, 1, True)
    assert bucket_bound(0.01) == 0.3 and bucket_bound(0.31) == 0.5 and bucket_bound(1e6) == 7680


def test_step_jitter_is_seeded_mean_one_and_redrawn_when_the_batch_changes() -> None:
    def steps(seed: int, index: int = 0, jitter: float = 0.25) -> list[tuple[float, int]]:
        """(duration over the model's, steps) of every event of two requests' service."""
        c = cost(step_jitter=jitter)
        replica = SimReplica.create(index, c, seed)
        replica.pool.ensure(100)
        replica.add(request(10, out=8))
        replica.add(request(10, 50, out=3))
        now, out = 0.0, []
        end = replica.start_step(now)
        while end is not None:
            p = replica.pending
            assert p is not None
            decodes = sum(1 for r, n in p.scheduled if n == 1 and r.output_done > 0)
            model = c.step_s(sum(n for _, n in p.scheduled) - decodes, decodes, 0)
            out.append(((end - now) / p.repeat / model, p.repeat))
            replica.finish_step(end)
            now, end = end, replica.start_step(end)
        return out

    assert [f for f, _ in steps(1, jitter=0.0)] == pytest.approx([1.0] * 4)  # the model
    first = steps(1)
    assert first == steps(1)  # seeded
    assert first != steps(2) and first != steps(1, index=1)  # per seed and replica
    # 165 tokens each under a 256 budget: the first prefill with part of the second (both
    # admitted), then the rest of the second with the first's first decode, a jump of 2
    # decodes of both (nothing changed: the same factor), and after the second finishes,
    # a new factor for the first's last 4 decodes alone.
    assert [n for _, n in first] == [1, 1, 2, 4]
    assert first[1][0] == pytest.approx(first[2][0]) and first[3][0] != first[2][0]
    # Mean 1 over replicas and seeds: the model's step on average.
    factors = [steps(seed, index)[0][0] for seed in range(40) for index in range(10)]
    assert np.mean(factors) == pytest.approx(1.0, abs=0.04)
    assert 0.2 < np.std(np.log(factors)) < 0.3


def trajectory_file(
    tmp_path: Path,
    steps: int = 6,
    ident: str = "tiny",
    task: str = "Fix the failing test in the inventory service.",
) -> Path:
    messages = [
        {"role": "system", "content": "You are a careful coding agent. " * 40},
        {"role": "user", "content": task},
    ]
    for i in range(steps):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
        messages.append({"role": "assistant", "content": f"step {i}", "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"output {i} " * 80})
    messages.append({"role": "assistant", "content": "done"})
    record = {
        "id": ident,
        "format": "native_tool_calls",
        "obs_role": "tool",
        "observation_indices": [3 + 2 * i for i in range(steps)],
        "messages": messages,
    }
    path = tmp_path / f"{ident}.jsonl"
    path.write_text(json.dumps(record) + "\n")
    return path


def simulate_tiny(tmp_path: Path, *extra: str, duration_s: int = 30) -> Path:
    """``foldgate simulate`` of one recording (``trajectory_file``) on two ``cpu-tiny``
    replicas, 4 sessions under ``sticky_cost``, with the ``extra`` options: its folder."""
    out = tmp_path / f"out{len(list(tmp_path.glob('out*')))}"
    result = CliRunner().invoke(
        main,
        [
            "simulate", str(trajectory_file(tmp_path)), "--preset", "cpu-tiny",
            "--replicas", "2", "--concurrency", "4", "--policy", "sticky_cost",
            "--strategy", "base", "--duration", str(duration_s), "--warmup", "5",
            "--tokenizer", "estimate", "--jobs", "1", *extra, "--out", str(out),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return out


def test_leading_blocks_two_recordings_have_in_common_are_shared(tmp_path: Path) -> None:
    # Two tasks of one agent: the same system prompt, and a first user message whose
    # template runs on past it. vLLM's chained hashes make every common leading block one
    # cached block; past where the tasks differ, each session's blocks are its own.
    template = "Please solve this issue, following the instructions below. " * 8
    a = trajectory_file(tmp_path, ident="a", task=template + "The inventory test fails.")
    b = trajectory_file(tmp_path, ident="b", task=template + "Billing rounds wrongly.")
    trajectories = load_trajectories(a) + load_trajectories(b)
    chat = ChatTokenizer(ByteEstimate())
    workload = build_workload(trajectories, chat, ReplayConfig(strategies=("base",), block_size=16))
    first_a = workload.runs[("a", "base")].steps[0]
    first_b = workload.runs[("b", "base")].steps[0]
    system_only = chat.message_count(trajectories[0].transcript.messages[0])
    assert first_a.head_tokens > system_only + 16  # the template's blocks are shared too
    assert np.array_equal(first_a.head, first_b.head)
    assert len(first_a.own) > 0 and len(first_b.own) > 0  # the tasks are not
    assert first_a.head_tokens + 16 * len(first_a.own) <= first_a.prompt_tokens


def test_a_recorded_reply_that_calls_no_tool_ends_its_agents_turn(tmp_path: Path) -> None:
    # Every reply of the recording calls a tool but its last, "done": the session's
    # footprint is reserved after each but that one (``SimRouting.ended``'s ``pausing``).
    workload = build_workload(
        load_trajectories(trajectory_file(tmp_path)),
        ChatTokenizer(ByteEstimate()),
        ReplayConfig(strategies=("base",), block_size=16),
    )
    steps = workload.runs[("tiny", "base")].steps
    assert [s.ends_turn for s in steps] == [False] * (len(steps) - 1) + [True]


def test_simulation_is_deterministic_and_sticky_keeps_prefixes(tmp_path: Path) -> None:
    trajectories = load_trajectories(trajectory_file(tmp_path))
    chat = ChatTokenizer(ByteEstimate())
    c = cost(kv_pool_tokens=200_000, max_num_batched_tokens=1024, max_num_seqs=64)
    workload = build_workload(trajectories, chat, ReplayConfig(strategies=("base",), block_size=16))
    # The head (system prompt) is shared by every session, the rest named per session.
    step = workload.runs[("tiny", "base")].steps[0]
    assert len(step.head) > 0 and workload.shared_ids == len(step.head)

    def run(policy: str, seed: int = 1) -> dict[str, object]:
        config = SimConfig(
            policy=policy,
            strategy="base",
            cost=c,
            replicas=3,
            concurrency=12,
            duration_s=120,
            warmup_s=10,
            think_s=1.0,
            seed=seed,
        )
        return simulate(workload, config).summary()

    sticky = run("sticky_cost")
    assert sticky == run("sticky_cost")
    poisson = SimConfig(
        policy="least_loaded",
        strategy="base",
        cost=c,
        replicas=2,
        concurrency=None,
        arrival_rate=0.5,
        duration_s=120,
        warmup_s=10,
        seed=3,
    )
    arrivals = simulate(workload, poisson)
    assert arrivals.summary() == simulate(workload, poisson).summary()
    assert arrivals.load == "0.5/s Poisson" and 20 < arrivals.sessions_started < 100
    assert sticky != run("sticky_cost", seed=2)
    spread = run("round_robin")
    assert sticky["requests"] > 0 and spread["requests"] > 0
    assert sticky["prefix_hit_rate"] > spread["prefix_hit_rate"]


def test_simulate_command_writes_its_report(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(
        main,
        [
            "simulate",
            str(trajectory_file(tmp_path)),
            "--preset",
            "cpu-tiny",
            "--replicas",
            "2",
            "--concurrency",
            "4",
            "--policy",
            "sticky,sticky_cost,least_loaded",
            "--strategy",
            "base,refold",
            "--duration",
            "60",
            "--warmup",
            "5",
            "--tokenizer",
            "estimate",
            "--jobs",
            "1",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "| sticky | refold | 4 concurrent |" in result.output
    assert {p.name for p in out.iterdir()} == {
        "results.csv",
        "results.json",
        "report.md",
        "kv_usage.png",
        "cells.png",
    }
    cells = json.loads((out / "results.json").read_text())["cells"]
    assert [(c["policy"], c["strategy"]) for c in cells] == [
        (p, s) for s in ("base", "refold") for p in ("sticky", "sticky_cost", "least_loaded")
    ]
    # The priced sticky's judgement, at the one load given, in the output and the report.
    assert "one load simulated: judged there" in result.output
    assert "- refold at 4 concurrent: sticky_cost's hit rate" in result.output
    assert "## Priced sticky at the knee" in (out / "report.md").read_text()


def test_kv_pool_tokens_replaces_the_presets_pool_and_nothing_else(tmp_path: Path) -> None:
    # The what-if behind a ceiling (a pool nothing is evicted from) must change the pool
    # only: the cost model's other terms, the engine shape and the run's setup stay.
    preset = get_preset("cpu-tiny")
    bigger = preset.with_pool(10 * preset.kv_pool_tokens)
    changed = {k: v for k, v in asdict(bigger).items() if asdict(preset)[k] != v}
    assert changed == {"kv_pool_tokens": 10 * preset.kv_pool_tokens}
    assert SimReplica.create(0, bigger).pool.capacity == bigger.kv_pool_blocks - 1

    def setup(*extra: str) -> dict[str, Any]:
        out = simulate_tiny(tmp_path, *extra)
        run = json.loads((out / "results.json").read_text())["setup"]
        del run["wall time (s)"]
        return run

    plain, pooled = setup(), setup("--kv-pool-tokens", "1000000")
    assert plain.pop("kv pool per replica (tokens)") == f"{preset.kv_pool_tokens:,}"
    assert pooled.pop("kv pool per replica (tokens)") == "1,000,000"
    assert plain == pooled


def test_the_request_log_holds_every_measured_request_as_it_was_served(tmp_path: Path) -> None:
    out = simulate_tiny(tmp_path, "--log-requests", duration_s=60)
    cell = json.loads((out / "results.json").read_text())["cells"][0]
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert len(records) == cell["requests"] > 0
    assert {(r["policy"], r["strategy"], r["load"]) for r in records} == {
        ("sticky_cost", "base", "4 concurrent")
    }
    for r in records:
        assert 5 <= r["sent"] <= r["arrival"] <= r["first_scheduled"] <= r["first_token"]
        assert r["first_token"] <= r["finished"] and 0 <= r["cached_tokens"] < r["prompt_tokens"]
        assert r["replica"] in (0, 1) and r["reason"] in ("new", "sticky", "queue_cost")
    # A session's requests are its steps in order, each sent after the last one finished.
    by_session: dict[int, list[dict[str, Any]]] = {}
    for r in records:
        by_session.setdefault(r["session"], []).append(r)
    for mine in by_session.values():
        steps = [r["step"] for r in mine]
        assert steps == list(range(steps[0], steps[0] + len(steps)))
        assert all(a["finished"] <= b["sent"] for a, b in itertools.pairwise(mine))
    # Without the flag, no log.
    workload = build_workload(
        load_trajectories(trajectory_file(tmp_path)),
        ChatTokenizer(ByteEstimate()),
        ReplayConfig(strategies=("base",), block_size=16),
    )
    config = SimConfig(policy="sticky", strategy="base", cost=cost(), replicas=2,
                       concurrency=2, duration_s=30, warmup_s=0.0)  # fmt: skip
    assert simulate(workload, config).request_log == []


def test_cost_fit_recovers_known_coefficients_from_phases() -> None:
    truth = (0.012, 6e-5, 1e-3, 2e-8)
    phases = []
    for prompt in (128, 512, 2048, 6000):
        for seqs in (1, 4):
            for phase in (prefill_phase(prompt, 2048, 0.0), decode_phase(prompt, seqs, 20, 0.0)):
                seconds = sum(c * f for c, f in zip(truth, phase.features, strict=True))
                phases.append(replace(phase, seconds=seconds))
    assert fit_coefficients(phases) == pytest.approx(truth, rel=1e-6)
    # A 6000-token prompt under a 2048-token budget is 3 chunks attending 2048, 4096, 6000.
    assert prefill_phase(6000, 2048, 1.0).features == [3, 6000, 0, 12144]


def test_replayed_routes_replace_the_policy(tmp_path: Path) -> None:
    # One session over two replicas: routes that keep it on replica 1 cache as sticky does;
    # routes that alternate lose the prefix at every step, as round-robin does.
    workload = build_workload(
        load_trajectories(trajectory_file(tmp_path)),
        ChatTokenizer(ByteEstimate()),
        ReplayConfig(strategies=("base",), block_size=16),
    )
    steps = len(workload.runs[("tiny", "base")].steps)
    c = cost(kv_pool_tokens=200_000, max_num_batched_tokens=1024)

    def run(policy: str, routes: dict[tuple[int, int], int] | None = None, **kw: Any) -> CellResult:
        config = SimConfig(policy=policy, strategy="base", cost=c, replicas=2, concurrency=1,
                           sessions=1, think_s=0.0, warmup_s=0.0, routes=routes, **kw)  # fmt: skip
        return simulate(workload, config)

    kept = run("round_robin", {(0, k): 1 for k in range(steps)}).hit_rate
    alternating = run("sticky", {(0, k): k % 2 for k in range(steps)}).hit_rate
    assert kept == run("sticky").hit_rate > 0.5
    assert alternating == run("round_robin").hit_rate < kept
    # A replayed schedule holds each request until the time the run sent it.
    timed = run("sticky", send_times={(0, k): 100.0 * k for k in range(steps)})
    assert timed.window_s > 100.0 * (steps - 1) > run("sticky").window_s
    assert timed.hit_rate == kept


def test_simulate_compare_and_fit_read_locust_experiments(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    traj = trajectory_file(tmp_path / "logs")
    cells = [
        {"cell": "base_sticky_u2", "arm": "gateway", "strategy": "base", "routing": "sticky",
         "users": 1, "kv_cache_bytes": 10485760, "server": "uvicorn", "load": "sessions"},
        {"cell": "no-gw", "arm": "no_gateway", "strategy": "-", "routing": "round_robin",
         "users": 0, "kv_cache_bytes": 10485760, "server": "-", "load": "steps"},
    ]  # fmt: skip
    settings = {"trajectories": [str(traj)], "replicas": 1, "max_steps": 3, "block_size": 32,
                "think_time": "0", "max_tokens_cap": 8, "budget": 0}  # fmt: skip
    columns = ["cell", "vllm_prefix_hit_rate", "vllm_queue_time_mean_s",
               "vllm_queue_time_p95_s", "session_steps_per_min", "ttft_p50_ms",
               "vllm_prompt_tokens"]  # fmt: skip
    runs = []
    for n, hit in enumerate(("0.5", "0.7")):
        exp = tmp_path / f"exp{n}"
        (exp / "base_sticky_u2").mkdir(parents=True)
        (exp / "profile.json").write_text(json.dumps({"settings": settings, "cells": cells}))
        (exp / "results.csv").write_text(
            ",".join(columns) + f"\nbase_sticky_u2,{hit},0.01,0.3,10,200,1000\n"
            "no-gw,0.4,0.01,0.3,9,150,900\n"
        )
        # One request alone on its replica: 11 tokens after the first in 1.1 s.
        log = {"ok": True, "replica": "http://r0", "start": 100.0, "ttft_ms": 300.0,
               "ttlt_ms": 1400.0, "prompt_tokens": 600, "cached_tokens": 0,
               "completion_tokens": 12, "trajectory": "tiny", "step": 0}  # fmt: skip
        (exp / "base_sticky_u2" / "requests.jsonl").write_text(json.dumps(log) + "\n")
        runs.append(str(exp))
    result = CliRunner().invoke(
        main, ["simulate-compare", *runs, "--root", str(tmp_path), "--tokenizer", "estimate"]
    )
    assert result.exit_code == 0, result.output
    (row,) = [line for line in result.output.splitlines() if line.startswith("| base_sticky")]
    assert row.startswith("| base_sticky_u2 | 60.0% |")  # the runs' mean, then simulated
    assert "no-gw" not in result.output  # only fixed-work cells are simulated
    assert "mean of 2 runs; simulated: 20 simulations pooled; prefix hit within" in result.output
    assert "same order by steps/min: yes (0 of 0 pairs ordered" in result.output
    one = CliRunner().invoke(main, ["simulate-compare", runs[0], "--root", str(tmp_path),
                                    "--tokenizer", "estimate", "--seeds", "1"])  # fmt: skip
    assert one.exit_code == 0, one.output
    assert "simulated: 1 simulation pooled" in one.output
    assert "one measured run: its spread is unknown" in one.output
    fit = CliRunner().invoke(main, ["simulate-fit", "--experiment", runs[0]])
    assert fit.exit_code == 0, fit.output
    # cpu-tiny's engine: 11 steps of 15 ms + 1.01 ms + attended; the rest is streaming.
    per_token = float(fit.output.split("per_output_token_s=")[1].split(",")[0])
    assert 0.08 < per_token < 0.09
    # Replaying the logged routes needs a replica for every request the cell sends.
    replay = [*runs, "--root", str(tmp_path), "--tokenizer", "estimate", "--replay", "routes"]
    result = CliRunner().invoke(main, ["simulate-compare", *replay])
    assert result.exit_code != 0 and "no logged replica for tiny step 1" in result.output
    for n, run in enumerate(runs):
        log = {"ok": True, "replica": f"http://r{n}", "start": 100.0, "ttft_ms": 300.0,
               "ttlt_ms": 1400.0, "prompt_tokens": 600, "cached_tokens": 0,
               "completion_tokens": 12, "trajectory": "tiny"}  # fmt: skip
        lines = [json.dumps(log | {"step": k}) for k in range(3)]
        (Path(run) / "base_sticky_u2" / "requests.jsonl").write_text("\n".join(lines) + "\n")
    replayed = CliRunner().invoke(main, ["simulate-compare", *replay])
    assert replayed.exit_code == 0, replayed.output
    (replayed_row,) = [ln for ln in replayed.output.splitlines() if ln.startswith("| base_sticky")]
    # Two runs simulated and pooled: the same figures as the policy's one run (one replica),
    # prompt tokens per run.
    assert replayed_row == row
    scheduled = CliRunner().invoke(main, ["simulate-compare", *replay[:-1], "schedule"])
    assert scheduled.exit_code == 0, scheduled.output
    (scheduled_row,) = [ln for ln in scheduled.output.splitlines() if ln.startswith("| base_s")]
    assert scheduled_row.split(" | ")[:4] == row.split(" | ")[:4]  # hit rates alike


def test_step_jitter_breaks_round_robins_lockstep(tmp_path: Path) -> None:
    # Five sessions of equal replies over two replicas, no think time: with fixed step
    # times the sessions settle into one cyclic order, and round-robin's global counter
    # then sends every session's next request to the other replica (an odd cycle over
    # two replicas), so nothing of its own context is ever cached. Real step times wander
    # (the preset's step_jitter, measured): the order reshuffles and a session lands where
    # its last request ran about half the time.
    paths = [trajectory_file(tmp_path, steps=8, ident=f"t{i}", task=f"task {i} " * 400)
             for i in range(5)]  # fmt: skip
    trajectories = [t for p in paths for t in load_trajectories(p)]
    workload = build_workload(
        trajectories,
        ChatTokenizer(ByteEstimate()),
        ReplayConfig(strategies=("base",), block_size=16),
    )

    def hit_rate(jitter: float, seed: int) -> float:
        # cpu-tiny's shape of costs (decode-bound); each pool holds about three sessions'
        # contexts, so a prefix left two requests back is mostly evicted.
        c = cost(per_step_s=0.015, per_prefill_token_s=2.4e-5, per_decode_seq_s=0.036,
                 kv_pool_tokens=8000, max_num_batched_tokens=2048, step_jitter=jitter)  # fmt: skip
        config = SimConfig(policy="round_robin", strategy="base", cost=c, replicas=2,
                           concurrency=5, sessions=5, think_s=0.0, warmup_s=0.0, seed=seed,
                           shuffle=False)  # fmt: skip
        return simulate(workload, config).hit_rate

    locked = [hit_rate(0.0, seed) for seed in range(3)]
    assert len(set(locked)) == 1  # no jitter: the seed changes nothing here
    jittered = [hit_rate(0.25, seed) for seed in range(3)]
    assert np.mean(jittered) > locked[0] + 0.15


def test_priced_sticky_is_judged_at_stickys_knee() -> None:
    def cell(policy: str, load: int, steps: int, hits: int, queue: list[float]) -> CellResult:
        return CellResult(policy=policy, strategy="base", load=f"{load} concurrent",
                          window_s=60.0, requests=steps, prefix_queries=100, prefix_hits=hits,
                          queue_s=queue, ttft_s=[], preemptions=0, moves=0,
                          sessions_started=load)  # fmt: skip

    c = cost()
    configs, results = [], []
    # sticky's throughput: 50, 95, 100 steps/min at 4, 8, 16 sessions: the knee is 8
    # (the first at 90% of the best).
    figures = {
        "sticky": {4: (50, 80, [0.1]), 8: (95, 80, [1.0]), 16: (100, 80, [5.0])},
        "sticky_cost": {4: (50, 80, [0.1]), 8: (96, 79, [1.1]), 16: (100, 70, [9.0])},
        "least_loaded": {4: (50, 40, [0.1]), 8: (90, 40, [1.0]), 16: (99, 40, [1.0])},
        "round_robin": {4: (50, 30, [0.2]), 8: (80, 30, [2.0]), 16: (90, 30, [3.0])},
    }
    for policy, by_load in figures.items():
        for load, (steps, hits, queue) in by_load.items():
            configs.append(SimConfig(policy=policy, strategy="base", cost=c, concurrency=load))
            results.append(cell(policy, load, steps, hits, queue))
    (j,) = judge(configs, results)
    assert (j.load, j.loads) == ("8 concurrent", 3)
    assert j.hit_points == pytest.approx(-1.0) and j.hit_ok  # at most 1 point below
    assert j.queue_ratio == pytest.approx(1.1) and j.queue_ok  # at most 10% above
    assert list(j.cells) == ["sticky", "sticky_cost", "least_loaded", "round_robin"]
    text = judgement_markdown([j])
    assert "| base | 8 concurrent | round_robin | 30.0% | 2.00 | 80.0 |" in text
    assert "sticky_cost's hit rate -1.0 points against sticky's (pass)" in text
    # One point more lost, or a p95 more than 10% above least_loaded's, fails.
    results[configs.index(SimConfig("sticky_cost", "base", c, concurrency=8))] = cell(
        "sticky_cost", 8, 96, 78, [1.2]
    )
    (worse,) = judge(configs, results)
    assert not worse.hit_ok and not worse.queue_ok
    assert "(FAIL)" in judgement_markdown([worse])
    # Without least_loaded's cells there is nothing to judge.
    kept = [i for i, cfg in enumerate(configs) if cfg.policy != "least_loaded"]
    assert judge([configs[i] for i in kept], [results[i] for i in kept]) == []


def test_token_interval_separates_its_replicas_decoders_from_the_others() -> None:
    # 50 ms between tokens alone, +40 ms per other request decoding on the same replica,
    # +5 ms per request decoding on another. Each group: n requests decoding side by side
    # on r0 for one stretch, while m requests on r1 decode throughout it (2 tokens each:
    # too short to be fitted themselves, but decoding beside the others).
    requests, t = [], 0.0
    for n, m in [(1, 0), (2, 0), (3, 0), (1, 1), (1, 2), (2, 1), (3, 3)]:
        span = 20 * (0.05 + 0.04 * (n - 1) + 0.005 * m)
        requests += [ServedRequest("r0", t, t + 1, t + 1 + span, 500, 0, 21) for _ in range(n)]
        requests += [ServedRequest("r1", t, t, t + 2 + span, 500, 0, 2) for _ in range(m)]
        t += 100.0
    got = token_interval(requests)
    assert (got.alone_s, got.per_same_replica_s, got.per_other_replica_s) == pytest.approx(
        (0.05, 0.04, 0.005), rel=1e-6
    )
    assert got.r2 == pytest.approx(1.0) and got.requests == 13
    with pytest.raises(ValueError, match="fewer than 3"):
        token_interval(requests[:2])


def test_sessions_starting_together_are_routed_in_session_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Five sessions with no think time send their first requests at one instant, in session
    # order (as Locust's users, spawned in order, do): every seed routes them alike.
    import offline.sim.cluster as cluster

    routed: list[str] = []

    def recording(name: str, **kwargs: Any) -> Any:
        policy = make_policy(name, **kwargs)
        choose = policy.choose

        async def record(tenant: str, session: str, pool: Any, **kw: Any) -> Any:
            routed.append(session)
            return await choose(tenant, session, pool, **kw)

        policy.choose = record  # type: ignore[method-assign]
        return policy

    monkeypatch.setattr(cluster, "make_policy", recording)
    workload = build_workload(
        load_trajectories(trajectory_file(tmp_path, steps=1)),
        ChatTokenizer(ByteEstimate()),
        ReplayConfig(strategies=("base",), block_size=16),
    )

    def first_routed(seed: int, think_s: float = 0.0) -> list[str]:
        routed.clear()
        config = SimConfig(policy="sticky", strategy="base", cost=cost(), replicas=2,
                           concurrency=5, sessions=5, think_s=think_s, warmup_s=0.0,
                           seed=seed)  # fmt: skip
        simulate(workload, config)
        return routed[:5]

    # Session ids are salted by the seed ("seed:index"); the order is the sessions'.
    orders = {tuple(s.split(":")[1] for s in first_routed(seed)) for seed in range(6)}
    assert orders == {("0", "1", "2", "3", "4")}


def test_a_replica_keeps_one_block_out_as_vllms_null_block() -> None:
    # vLLM's BlockPool takes one block off the free queue as the null block at start: a
    # pool of N blocks holds N - 1 for requests and the prefix cache.
    model = cost()
    assert SimReplica.create(0, model).pool.capacity == model.kv_pool_blocks - 1


def test_peer_cells_are_read_in_foldgates_format_and_simulated_by_their_policy(
    tmp_path: Path,
) -> None:
    """vllm-router's cells (arm vllm_router, its router_policy) and the straight round-robin
    calibrate like foldgate's; an arm the simulator does not model is left out, and a figure
    the results row lacks is NaN."""
    cells = [
        {"cell": "peer-ch", "arm": "vllm_router", "strategy": "-", "routing": "-",
         "router_policy": "consistent_hash", "users": 2, "kv_cache_bytes": 1, "load": "sessions"},
        {"cell": "peer-kv", "arm": "vllm_router", "strategy": "-", "routing": "-",
         "router_policy": "kv_aware", "users": 2, "kv_cache_bytes": 1, "load": "sessions"},
        {"cell": "rr", "arm": "no_gateway", "strategy": "-", "routing": "round_robin",
         "users": 2, "kv_cache_bytes": 1, "load": "sessions"},
        {"cell": "fg", "arm": "gateway", "strategy": "refold", "routing": "sticky",
         "users": 2, "kv_cache_bytes": 1, "load": "sessions"},
    ]  # fmt: skip
    (tmp_path / "profile.json").write_text(json.dumps({"settings": {}, "cells": cells}))
    (tmp_path / "results.csv").write_text(
        "cell,vllm_prefix_hit_rate,vllm_queue_time_mean_s\npeer-ch,0.8,\npeer-kv,0.7,0.1\n"
        "rr,0.5,0.2\nfg,0.78,0.3\n"
    )
    _, read = read_experiment(tmp_path)
    assert [(c.name, c.arm, c.routing, c.strategy) for c in read] == [
        ("peer-ch", "vllm_router", "consistent_hash", "base"),
        ("rr", "no_gateway", "round_robin", "base"),
        ("fg", "gateway", "sticky", "refold"),
    ]
    assert read[0].number("vllm_prefix_hit_rate") == 0.8
    assert math.isnan(read[0].number("vllm_queue_time_mean_s"))
    assert math.isnan(read[0].number("ttft_p50_ms"))


def test_the_simulators_admission_is_built_with_the_cells_wait_bound_and_reservation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[Any] = []

    def recording(knobs: Any) -> AdmitAll:
        built.append(knobs)
        return AdmitAll()

    monkeypatch.setitem(ADMISSIONS, "recording", recording)
    workload = build_workload(
        load_trajectories(trajectory_file(tmp_path)),
        ChatTokenizer(ByteEstimate()),
        ReplayConfig(strategies=("base",), block_size=16),
    )
    for wait_s, reserve in ((7.5, False), (30.0, True)):
        config = SimConfig(policy="sticky", strategy="base", cost=cost(), replicas=2,
                           concurrency=2, sessions=2, think_s=0.0, warmup_s=0.0,
                           admission="recording", admission_max_wait_s=wait_s,
                           pause_reservation=reserve)  # fmt: skip
        simulate(workload, config)
        assert (built[-1].admission_max_wait_s, built[-1].pause_reservation) == (wait_s, reserve)
    assert SimConfig("sticky", "base", cost()).admission_max_wait_s == ADMISSION_MAX_WAIT_S


class OneAtATime:
    """A test admission: a request waits while its replica serves another (asked again at
    the next reply end: ``wake`` names every waiter), so the seam's hold, retry and release
    paths all run."""

    def __init__(self) -> None:
        self.busy: set[str] = set()
        self.waiting: dict[tuple[str, str], None] = {}  # in arrival order

    @classmethod
    def from_knobs(cls, knobs: Any) -> OneAtATime:
        return cls()

    def decide(self, request: AdmissionRequest) -> AdmissionVerdict:
        key = (request.tenant, request.session)
        if request.replica in self.busy:
            self.waiting.setdefault(key)
            return AdmissionVerdict(False, "busy")
        self.waiting.pop(key, None)
        return AdmissionVerdict(True)

    def started(self, request: AdmissionRequest) -> None:
        self.busy.add(request.replica)

    def wake(self, ask: Callable[[tuple[str, str]], object]) -> None:
        for key in list(self.waiting):
            if key in self.waiting:
                ask(key)

    def ended(
        self,
        tenant: str,
        session: str,
        replica: str,
        now: float,
        *,
        served: bool = True,
        first_token: tuple[int, float] | None = None,
        pausing: bool = True,
    ) -> None:
        self.busy.discard(replica)


def test_the_admission_seam_holds_requests_at_the_gateway_and_every_session_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(ADMISSIONS, "one_at_a_time", OneAtATime.from_knobs)
    workload = build_workload(
        load_trajectories(trajectory_file(tmp_path)),
        ChatTokenizer(ByteEstimate()),
        ReplayConfig(strategies=("base",), block_size=16),
    )
    steps = len(workload.runs[("tiny", "base")].steps)

    def run(admission: str) -> CellResult:
        config = SimConfig(policy="sticky", strategy="base", cost=cost(kv_pool_tokens=50_000),
                           replicas=2, concurrency=6, sessions=6, think_s=0.0, warmup_s=0.0,
                           admission=admission)  # fmt: skip
        return simulate(workload, config)

    held = run("one_at_a_time")
    assert held.requests == 6 * steps  # nobody starves: every session ran to its end
    assert len(held.admission_wait_s) == held.requests
    assert max(held.admission_wait_s) > 0  # some waited at the gateway
    off = run("off")  # the default: every request goes at once
    assert off.requests == 6 * steps and max(off.admission_wait_s) == 0.0
    assert off.window_s < held.window_s


class DeadlineAtNow(AdmitAll):
    """A test admission whose refusal says to ask again at the instant it was asked (what
    ``now + max_wait - waited`` gives where it rounds to ``now``); it admits a request asked
    at a later instant than its first ask, and fails one asked again and again at one."""

    ASKS_AT_ONE_INSTANT = 100

    def __init__(self) -> None:
        self.first: dict[tuple[str, str], float] = {}
        self.asks: dict[tuple[tuple[str, str], float], int] = {}

    @classmethod
    def from_knobs(cls, knobs: Any) -> DeadlineAtNow:
        return cls()

    def decide(self, request: AdmissionRequest) -> AdmissionVerdict:
        key = (request.tenant, request.session)
        first = self.first.setdefault(key, request.now)
        if request.now > first:
            del self.first[key]
            return AdmissionVerdict(True, "waited")
        asks = self.asks[(key, request.now)] = self.asks.get((key, request.now), 0) + 1
        assert asks < self.ASKS_AT_ONE_INSTANT, "asked again and again at one instant"
        return AdmissionVerdict(False, "waiting", retry_at=request.now)

    def wake(self, ask: Callable[[tuple[str, str]], object]) -> None:
        for key in list(self.first):
            if key in self.first:
                ask(key)


def test_a_held_requests_next_ask_is_after_the_instant_it_was_refused_at(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retry time at (or before) the refusal's instant is asked after it, not at it:
    simulated time stands still between events, so asking at that instant again would
    repeat forever (38a1832)."""
    monkeypatch.setitem(ADMISSIONS, "deadline_at_now", DeadlineAtNow.from_knobs)
    workload = build_workload(
        load_trajectories(trajectory_file(tmp_path)),
        ChatTokenizer(ByteEstimate()),
        ReplayConfig(strategies=("base",), block_size=16),
    )
    steps = len(workload.runs[("tiny", "base")].steps)
    config = SimConfig(policy="sticky", strategy="base", cost=cost(kv_pool_tokens=50_000),
                       replicas=2, concurrency=3, sessions=3, think_s=1.0, warmup_s=0.0,
                       admission="deadline_at_now")  # fmt: skip
    held = simulate(workload, config)
    assert held.requests == 3 * steps  # every request went, each at its second ask
    assert all(0 < w < 1e-6 for w in held.admission_wait_s), held.admission_wait_s


def test_a_time_scale_stretches_a_fixed_work_cell_by_its_factor(tmp_path: Path) -> None:
    workload = build_workload(
        load_trajectories(trajectory_file(tmp_path)),
        ChatTokenizer(ByteEstimate()),
        ReplayConfig(strategies=("base",), block_size=16),
    )

    def run(c: CostModel) -> CellResult:
        config = SimConfig(policy="sticky", strategy="base", cost=c, replicas=2,
                           concurrency=4, sessions=4, think_s=0.0, warmup_s=0.0)  # fmt: skip
        return simulate(workload, config)

    pool = cost(kv_pool_tokens=50_000)
    base, slow = run(pool), run(scaled(pool, 3.0))
    assert slow.requests == base.requests
    assert slow.window_s == pytest.approx(3.0 * base.window_s)
    assert slow.prefix_hits == base.prefix_hits  # the same schedule, three times as slow


def test_recorded_think_times_replace_the_draw_cut_at_the_cap(tmp_path: Path) -> None:
    # As the Locust harness replays a recording: the gap the trajectory logged before each
    # request, cut at the cap; the draw where it logged none (here the second request).
    (trajectory,) = load_trajectories(trajectory_file(tmp_path, steps=3))
    n = len(trajectory.transcript.messages)
    replies = [i for i, m in enumerate(trajectory.transcript.messages) if m.role == "assistant"]
    times: list[MessageTime | None] = [None] * n
    for reply, at in zip(replies, (100.0, 120.0, 125.0, 200.0), strict=True):
        times[reply] = MessageTime(at)
    times[replies[1] + 1] = MessageTime(130.0)  # the observation after reply 1, 10 s later
    times[replies[2] + 1] = None  # nothing logged between replies 2 and 3 but their ends
    times[replies[2]] = None
    trajectory = replace(trajectory, times=tuple(times))
    gaps = trajectory.think_times()
    assert gaps[2] == 10.0 and gaps[1] is not None and gaps[3] is None
    config = ReplayConfig(strategies=("base",), block_size=16)
    workload = build_workload([trajectory], ChatTokenizer(ByteEstimate()), config)
    steps = workload.runs[(trajectory.id, "base")].steps
    assert [s.think_s for s in steps] == gaps

    def sends(**kw: Any) -> list[float]:
        config = SimConfig(policy="sticky", strategy="base", cost=cost(kv_pool_tokens=200_000),
                           replicas=1, concurrency=1, sessions=1, think_s=1.0, warmup_s=0.0,
                           log_requests=True, **kw)  # fmt: skip
        log = simulate(workload, config).request_log
        return [b.sent - a.finished for a, b in itertools.pairwise(log)]

    drawn = sends()
    recorded = sends(think_cap_s=6.0)
    assert recorded[0] == pytest.approx(min(gaps[1], 6.0))  # type: ignore[type-var]
    assert recorded[1] == pytest.approx(6.0)  # 10 s logged, cut at the cap
    assert 0 < recorded[2] != pytest.approx(6.0)  # none logged: a draw
    assert drawn[:2] != pytest.approx(recorded[:2])  # without the cap, every gap is drawn
    with pytest.raises(ValueError, match="think_cap_s"):
        SimConfig(policy="sticky", strategy="base", cost=cost(), think_cap_s=-1.0)
