"""The experiment's pure parts: profiles -> cells, vLLM scrapes -> figures, rows -> report."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.tokens import ChatTokenizer, get_counter
from gateway.transcript import Message, Text, Transcript
from loadtests.plan import DEFAULT_CONFIG, PlanError, load_profile, select
from loadtests.sessions import build_session
from loadtests.vllm_metrics import Histogram, Window, parse
from offline.importers import MessageTime, Trajectory

PAGE = """\
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{engine="0",model_name="tiny"}} {queries}
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{{engine="0",model_name="tiny"}} {hits}
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{engine="0",model_name="tiny"}} {preempted}
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="tiny"}} {kv}
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="tiny"}} 0
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_bucket{{engine="0",le="0.1",model_name="tiny"}} {q1}
vllm:request_queue_time_seconds_bucket{{engine="0",le="1.0",model_name="tiny"}} {q2}
vllm:request_queue_time_seconds_bucket{{engine="0",le="+Inf",model_name="tiny"}} {q2}
vllm:request_queue_time_seconds_sum{{engine="0",model_name="tiny"}} {qsum}
vllm:request_queue_time_seconds_count{{engine="0",model_name="tiny"}} {q2}
"""


def page(**values: float) -> str:
    defaults = dict(queries=0, hits=0, preempted=0, kv=0, q1=0, q2=0, qsum=0)
    return PAGE.format(**{**defaults, **values})


def test_window_takes_differences_and_sums_replicas() -> None:
    before = [parse("a", page(queries=100, hits=50), 0), parse("b", page(), 0)]
    after = [
        parse("a", page(queries=300, hits=200, preempted=2, q1=8, q2=10, qsum=2.0), 9),
        parse("b", page(queries=100, hits=20, q1=10, q2=10, qsum=0.5), 9),
    ]
    window = Window(
        before, after, during=[[parse("a", page(kv=0.5), 5), parse("b", page(kv=0.1), 5)]]
    )
    assert window.prefix_hit_rate == pytest.approx((150 + 20) / (200 + 100))
    assert window.counter("vllm:num_preemptions_total") == 2
    queue = window.histogram("vllm:request_queue_time_seconds")
    assert queue.count == 20 and queue.mean == pytest.approx(2.5 / 20)
    assert window.gauge_series("vllm:kv_cache_usage_perc") == [(5, [0.5, 0.1])]


def test_histogram_quantile_is_the_bound_of_the_bucket_holding_the_rank() -> None:
    h = Histogram({0.1: 50.0, 1.0: 90.0, float("inf"): 100.0}, sum=20.0, count=100.0)
    assert h.quantile(0.5) == 0.1
    assert h.quantile(0.7) == 1.0
    assert h.quantile(0.95) == 1.0  # past the largest finite bound: that bound
    assert Histogram({}, 0.0, 0.0).quantile(0.5) is None


def test_shipped_profiles_expand_to_their_cells_grouped_by_pool() -> None:
    quick = load_profile("quick")
    names = [c.name for c in quick.cells]
    assert names == [
        "base_sticky_u5_kv8M",
        "base_sticky-cost_u5_kv8M",
        "base_round-robin_u5_kv8M",
        "base_least-loaded_u5_kv8M",
        "refold_sticky-cost_steps_kv8M",
        "no-gateway_rr_steps_kv8M",
        "base_sticky_u5_kv4M",
        "refold_sticky_u5_kv4M",
        "cliff_sticky_u5_kv4M",
    ]
    assert quick.settings.replicas == 2 and quick.settings.step_users == (1, 2, 4, 8)
    # vLLM refuses a pool smaller than one max-length request
    assert min(c.kv_cache_bytes for c in quick.cells) >= quick.settings.max_model_len * 512
    full = load_profile("full")
    assert len(full.cells) == 4 * 4 * 2 * 2 + 4 + 1 + 2
    assert {c.routing for c in full.cells} == {
        "sticky", "sticky_cost", "round_robin", "least_loaded"
    }  # fmt: skip
    # one replica start per pool: cells of a pool run one after another
    pools = [c.kv_cache_bytes for c in full.cells]
    assert len([p for i, p in enumerate(pools) if i == 0 or pools[i - 1] != p]) == len(set(pools))


def test_cells_filter_keeps_matching_cells_and_refuses_a_pattern_matching_none() -> None:
    quick = load_profile("quick")
    picked = select(quick, ["*_kv4M", "no-gateway_*"])
    assert [c.name for c in picked.cells] == [
        "no-gateway_rr_steps_kv8M",
        "base_sticky_u5_kv4M",
        "refold_sticky_u5_kv4M",
        "cliff_sticky_u5_kv4M",
    ]
    with pytest.raises(PlanError, match="matches nope"):
        select(quick, ["base_*", "nope"])


def test_bad_profiles_are_refused_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="no profile 'nope'"):
        load_profile("nope")
    bad = tmp_path / "bad.toml"
    text = DEFAULT_CONFIG.read_text().replace(
        'routing = "sticky_cost"\nserver', 'routing = "random"\nserver'
    )
    bad.write_text(text)
    with pytest.raises(PlanError, match="routing must be one of"):
        load_profile("full", bad)


def test_session_steps_carry_the_trajectorys_recorded_think_times() -> None:
    messages = (
        Message("user", (Text("task"),)),
        Message("assistant", (Text("a"),)),
        Message("user", (Text("out"),)),
        Message("assistant", (Text("b"),)),
    )
    times = (None, MessageTime(10.0), MessageTime(12.5), MessageTime(20.0))
    run = Trajectory("t", "mini-swe-agent", "text_actions", Transcript(messages), Path("t"),
                     times=times)  # fmt: skip
    session = build_session(run, ChatTokenizer(get_counter("estimate")), "tiny")
    assert [(s.index, s.think_s) for s in session.steps] == [(0, None), (1, 2.5)]
