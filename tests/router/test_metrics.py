import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from router import MetricsParseError, ReplicaMetrics, parse_vllm_metrics
from router.metrics import parse_metrics_page

# Shape of a vLLM 0.32 (V1 engine) /metrics page, trimmed: process metrics, histograms and
# `_created` samples interleave with the gauges and counters the router reads.
V1_PAGE = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 11234.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny-qwen"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny-qwen"} 2.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny-qwen"} 0.4375
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny-qwen"} 52480.0
# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="tiny-qwen"} 1.7646528e+09
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="tiny-qwen"} 45920.0
# HELP vllm:prompt_tokens_cached_total Number of cached prompt tokens (local + external).
# TYPE vllm:prompt_tokens_cached_total counter
vllm:prompt_tokens_cached_total{engine="0",model_name="tiny-qwen"} 45824.0
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="tiny-qwen"} 0.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_sum{engine="0",model_name="tiny-qwen"} 4.21
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="tiny-qwen"} 30.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="tiny-qwen"} 41.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="tiny-qwen"} 41.0
"""

# Older engines: `gpu_` names, counters declared without the `_total` suffix in TYPE.
LEGACY_PAGE = """\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 1.0
# HELP vllm:num_requests_swapped Number of requests swapped to CPU.
# TYPE vllm:num_requests_swapped gauge
vllm:num_requests_swapped{model_name="m"} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 4.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.9
# HELP vllm:gpu_prefix_cache_queries Prefix cache queries.
# TYPE vllm:gpu_prefix_cache_queries counter
vllm:gpu_prefix_cache_queries_total{model_name="m"} 1000.0
# HELP vllm:gpu_prefix_cache_hits Prefix cache hits.
# TYPE vllm:gpu_prefix_cache_hits counter
vllm:gpu_prefix_cache_hits_total{model_name="m"} 250.0
"""


def test_v1_page() -> None:
    m = parse_vllm_metrics(V1_PAGE)
    assert m == ReplicaMetrics(
        running=3,
        waiting=2,
        kv_cache_usage=0.4375,
        prefix_cache_queries=52480,
        prefix_cache_hits=45920,
        prompt_tokens_cached=45824,
    )
    assert m.load == 5
    assert m.prefix_cache_hit_rate == pytest.approx(45920 / 52480)


def test_legacy_page() -> None:
    m = parse_vllm_metrics(LEGACY_PAGE)
    assert (m.running, m.waiting, m.kv_cache_usage) == (1, 4, 0.9)
    assert (m.prefix_cache_queries, m.prefix_cache_hits) == (1000, 250)
    assert m.prompt_tokens_cached is None
    assert m.prefix_cache_hit_rate == 0.25


def test_v1_names_win_over_legacy_on_the_same_page() -> None:
    both = V1_PAGE + LEGACY_PAGE.replace("vllm:num_requests", "vllm:ignored")
    m = parse_vllm_metrics(both)
    assert m.kv_cache_usage == 0.4375
    assert m.prefix_cache_queries == 52480


def test_engines_are_summed_and_kv_usage_averaged() -> None:
    page = """\
vllm:num_requests_running{engine="0",model_name="a"} 2
vllm:num_requests_running{engine="1",model_name="a"} 5
vllm:num_requests_waiting{engine="0",model_name="a"} 1
vllm:num_requests_waiting{engine="1",model_name="a"} 0
vllm:kv_cache_usage_perc{engine="0",model_name="a"} 0.2
vllm:kv_cache_usage_perc{engine="1",model_name="a"} 0.6
"""
    m = parse_vllm_metrics(page)
    assert (m.running, m.waiting) == (7, 1)
    assert m.kv_cache_usage == pytest.approx(0.4)
    assert m.prefix_cache_hit_rate is None


def test_page_without_vllm_gauges_names_what_is_missing() -> None:
    page = "# TYPE python_info gauge\npython_info 1.0\nvllm:num_requests_running 1\n"
    with pytest.raises(MetricsParseError, match="vllm:num_requests_waiting"):
        parse_vllm_metrics(page)


def test_malformed_text_is_rejected() -> None:
    with pytest.raises(MetricsParseError, match="malformed"):
        parse_vllm_metrics("vllm:num_requests_running{engine=} not-a-number\n")


# No per-example deadline: a loaded CI machine is slow, not wrong.
@settings(deadline=None)
@given(
    running=st.lists(st.integers(0, 500), min_size=1, max_size=4),
    waiting=st.lists(st.integers(0, 500), min_size=1, max_size=4),
    hits=st.integers(0, 10**9),
)
def test_round_trip_through_prometheus_client(
    running: list[int], waiting: list[int], hits: int
) -> None:
    # Exposition text produced by the same library vLLM uses, with one label set per engine.
    registry = CollectorRegistry()
    run_g = Gauge("vllm:num_requests_running", "r", ["engine"], registry=registry)
    wait_g = Gauge("vllm:num_requests_waiting", "w", ["engine"], registry=registry)
    queries = Counter("vllm:prefix_cache_queries", "q", ["engine"], registry=registry)
    hits_c = Counter("vllm:prefix_cache_hits", "h", ["engine"], registry=registry)
    for i, v in enumerate(running):
        run_g.labels(engine=str(i)).set(v)
    for i, v in enumerate(waiting):
        wait_g.labels(engine=str(i)).set(v)
    queries.labels(engine="0").inc(hits * 2)
    hits_c.labels(engine="0").inc(hits)
    m = parse_vllm_metrics(generate_latest(registry).decode())
    assert m.running == sum(running)
    assert m.waiting == sum(waiting)
    assert m.prefix_cache_hits == hits
    expected_rate = 0.5 if hits else None
    assert m.prefix_cache_hit_rate == expected_rate


def test_the_page_keeps_histogram_buckets_apart_from_samples() -> None:
    page = parse_metrics_page(V1_PAGE)
    ttft = "vllm:time_to_first_token_seconds"
    assert page.buckets[ttft] == {0.1: 30.0, float("inf"): 41.0}
    assert page.total(f"{ttft}_sum") == 4.21
    assert page.total(f"{ttft}_count") == 41.0
    assert f"{ttft}_bucket" not in page.totals
    assert page.total("python_gc_objects_collected_total") is None  # not vLLM's


def _oracle(text: str) -> dict[str, float]:
    """prometheus_client's own parser: every finite vllm: sample but buckets, summed."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("vllm:") and not s.name.endswith("_bucket"):
                totals[s.name] = totals.get(s.name, 0.0) + s.value
    return totals


@settings(deadline=None)
@given(
    label=st.text(alphabet=st.sampled_from('ab{},="\\\n '), max_size=12),
    values=st.lists(st.floats(0, 1e9, allow_nan=False), min_size=1, max_size=3),
)
def test_the_page_reads_what_prometheus_clients_own_parser_reads(
    label: str, values: list[float]
) -> None:
    # Label values with braces, commas, quotes, backslashes and newlines (escaped as the
    # exposition format escapes them), and a histogram beside the gauges.
    registry = CollectorRegistry()
    gauge = Gauge("vllm:num_requests_running", "r", ["engine", "odd"], registry=registry)
    for i, v in enumerate(values):
        gauge.labels(engine=str(i), odd=label).set(v)
    Gauge("vllm:num_requests_waiting", "w", registry=registry).set(1)
    histogram = Histogram("vllm:e2e_request_latency_seconds", "l", ["odd"], registry=registry)
    histogram.labels(odd=label).observe(0.3)
    text = generate_latest(registry).decode()
    page = parse_metrics_page(text)
    assert page.totals == pytest.approx(_oracle(text))
    buckets = page.buckets["vllm:e2e_request_latency_seconds"]
    assert buckets[0.25] == 0.0 and buckets[0.5] == 1.0 and buckets[float("inf")] == 1.0


def test_a_sample_with_a_timestamp_counts_and_a_bucket_with_broken_labels_is_refused() -> None:
    page = parse_metrics_page('vllm:num_requests_running{engine="0"} 3 1700000000000\n')
    assert page.total("vllm:num_requests_running") == 3
    with pytest.raises(MetricsParseError, match="malformed"):
        parse_metrics_page("vllm:x_bucket{le=0.5} 1\n")
    with pytest.raises(MetricsParseError, match="malformed"):
        parse_metrics_page('vllm:x{engine="0" 1\n')
