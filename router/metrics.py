"""Parse a vLLM `/metrics` page (Prometheus text format): the one parser of that page.

``parse_metrics_page`` reads every ``vllm:`` sample, summed over its labels, and every
histogram's buckets; ``parse_vllm_metrics`` takes the few numbers routing needs from it
(``loadtests.vllm_metrics`` takes an experiment's). Both the V1 metric names and the legacy
`gpu_` names are understood; when a page carries both (vLLM exported the old names for a
while after renaming), the V1 name wins. The KV-cache usage fraction is averaged across
engines because a sum of fractions means nothing.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

# Sample names in order of preference (V1 first, then legacy).
_RUNNING = ("vllm:num_requests_running",)
_WAITING = ("vllm:num_requests_waiting",)
_KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
_PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
_PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
_PROMPT_TOKENS_CACHED = ("vllm:prompt_tokens_cached_total",)
_CACHE_CONFIG = "vllm:cache_config_info"


class MetricsParseError(ValueError):
    """The text is not a usable vLLM metrics page."""


@dataclass(frozen=True)
class ReplicaMetrics:
    """One scrape of one replica. Counters are cumulative since the replica started."""

    running: float
    waiting: float
    kv_cache_usage: float | None = None
    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None
    prompt_tokens_cached: float | None = None
    # The KV pool in tokens (``vllm:cache_config_info``: num_gpu_blocks * block_size).
    kv_pool_tokens: int | None = None

    @property
    def load(self) -> float:
        """Requests the engine holds: the routing load signal."""
        return self.running + self.waiting

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        """Cumulative hit fraction in tokens; None before the first query or if not exported."""
        if not self.prefix_cache_queries or self.prefix_cache_hits is None:
            return None
        return self.prefix_cache_hits / self.prefix_cache_queries


@dataclass(frozen=True)
class MetricsPage:
    """The ``vllm:`` samples of one page. Samples of one name that differ only in labels
    (``model_name``, ``engine``, ...) are summed; a histogram's ``_bucket`` samples are kept
    per upper bound instead (its ``_sum`` and ``_count`` are ordinary samples)."""

    totals: dict[str, float]  # sample name -> sum over its label sets
    label_sets: dict[str, int]  # sample name -> how many label sets (engines) it has
    buckets: dict[str, dict[float, float]]  # histogram name -> upper bound -> count
    kv_pool_tokens: int | None = None  # from the cache_config_info gauge's labels

    def total(self, name: str) -> float | None:
        return self.totals.get(name)

    def mean(self, name: str) -> float | None:
        """The mean over label sets: for fractions, which mean nothing summed."""
        return self.totals[name] / self.label_sets[name] if name in self.totals else None


def parse_metrics_page(text: str) -> MetricsPage:
    """Read a Prometheus text page; non-finite samples are skipped.

    Raises MetricsParseError when the text is malformed.
    """
    totals: dict[str, float] = defaultdict(float)
    label_sets: dict[str, int] = defaultdict(int)
    buckets: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    pool_tokens: int | None = None
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if not sample.name.startswith("vllm:") or not math.isfinite(sample.value):
                    continue
                if sample.name.endswith("_bucket") and "le" in sample.labels:
                    bound = float(sample.labels["le"])
                    buckets[sample.name.removesuffix("_bucket")][bound] += sample.value
                    continue
                totals[sample.name] += sample.value
                label_sets[sample.name] += 1
                if sample.name == _CACHE_CONFIG:
                    pool_tokens = (pool_tokens or 0) + _pool_tokens(sample.labels)
    except ValueError as exc:
        raise MetricsParseError(f"malformed Prometheus text: {exc}") from exc
    return MetricsPage(
        dict(totals),
        dict(label_sets),
        {name: dict(b) for name, b in buckets.items()},
        pool_tokens or None,
    )


def _pool_tokens(labels: dict[str, str]) -> int:
    """One engine's KV pool in tokens from its cache config labels (0 when not set yet)."""
    try:
        return int(labels.get("num_gpu_blocks") or 0) * int(labels.get("block_size") or 0)
    except ValueError:
        return 0


def parse_vllm_metrics(text: str) -> ReplicaMetrics:
    """Parse Prometheus exposition text from a vLLM replica.

    Raises MetricsParseError when the text is malformed or lacks the request gauges.
    """
    page = parse_metrics_page(text)

    def first(names: tuple[str, ...], *, mean: bool = False) -> float | None:
        for name in names:
            if name in page.totals:
                return page.mean(name) if mean else page.total(name)
        return None

    running = first(_RUNNING)
    waiting = first(_WAITING)
    missing = [names[0] for names, v in ((_RUNNING, running), (_WAITING, waiting)) if v is None]
    if missing:
        raise MetricsParseError(f"not a vLLM metrics page: missing {', '.join(missing)}")
    assert running is not None and waiting is not None  # narrowed by the check above
    return ReplicaMetrics(
        running=running,
        waiting=waiting,
        kv_cache_usage=first(_KV_USAGE, mean=True),
        prefix_cache_queries=first(_PREFIX_QUERIES),
        prefix_cache_hits=first(_PREFIX_HITS),
        prompt_tokens_cached=first(_PROMPT_TOKENS_CACHED),
        kv_pool_tokens=page.kv_pool_tokens,
    )
