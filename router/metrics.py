"""Parse a vLLM `/metrics` page (Prometheus text format) into the few numbers routing needs.

Both the V1 metric names and the legacy `gpu_` names are understood; when a page carries both
(vLLM exported the old names for a while after renaming), the V1 name wins. Samples of one
metric that differ only in labels (`model_name`, `engine`, ...) are summed, except the KV-cache
usage fraction, which is averaged across engines because a sum of fractions means nothing.
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


def parse_vllm_metrics(text: str) -> ReplicaMetrics:
    """Parse Prometheus exposition text from a vLLM replica.

    Raises MetricsParseError when the text is malformed or lacks the request gauges.
    """
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if not sample.name.startswith("vllm:") or not math.isfinite(sample.value):
                    continue
                sums[sample.name] += sample.value
                counts[sample.name] += 1
    except ValueError as exc:
        raise MetricsParseError(f"malformed Prometheus text: {exc}") from exc

    def first(names: tuple[str, ...], *, mean: bool = False) -> float | None:
        for name in names:
            if counts[name]:
                return sums[name] / counts[name] if mean else sums[name]
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
    )
