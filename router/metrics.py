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
import re
from collections import defaultdict
from dataclasses import dataclass

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
    """Read a Prometheus text page's ``vllm:`` samples, line by line; non-finite samples are
    skipped.

    A sample line is ``name[{labels}] value [timestamp]``. Only the labels read here are
    parsed (a histogram bucket's ``le``, the cache config's pool), so a page costs little
    more than its scanning: the gateway reads one per replica every probe interval, on its
    event loop, where prometheus_client's full parser cost six times as much
    (docs/results/2026-12-04-front-cpu.md).

    Raises MetricsParseError when a ``vllm:`` sample line is malformed.
    """
    totals: dict[str, float] = defaultdict(float)
    label_sets: dict[str, int] = defaultdict(int)
    buckets: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    pool_tokens: int | None = None
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue  # comments, blank lines, other exporters' samples
        name, labels, value = _sample(line)
        if not math.isfinite(value):
            continue
        if name.endswith("_bucket"):
            bound = _labels(labels, line).get("le")
            if bound is not None:
                buckets[name.removesuffix("_bucket")][_number(bound, line)] += value
                continue
        totals[name] += value
        label_sets[name] += 1
        if name == _CACHE_CONFIG:
            pool_tokens = (pool_tokens or 0) + _pool_tokens(_labels(labels, line))
    return MetricsPage(
        dict(totals),
        dict(label_sets),
        {name: dict(b) for name, b in buckets.items()},
        pool_tokens or None,
    )


_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_ESCAPES = re.compile(r"\\(.)")


def _sample(line: str) -> tuple[str, str, float]:
    """A sample line's name, its label block (without braces; empty: none) and value."""
    named = _NAME.match(line)
    assert named is not None  # the line starts with "vllm:"
    name, rest = named.group(), line[named.end() :]
    labels = ""
    if rest.startswith("{"):
        close = rest.rfind("}")  # label values may hold a brace; the value cannot
        if close < 0:
            raise MetricsParseError(f"malformed Prometheus text: unclosed labels in {line!r}")
        labels, rest = rest[1:close], rest[close + 1 :]
    fields = rest.split()
    if not 1 <= len(fields) <= 2:  # the value, and an optional timestamp
        raise MetricsParseError(f"malformed Prometheus text: {line!r}")
    return name, labels, _number(fields[0], line)


def _labels(block: str, line: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    at = 0
    while at < len(block):
        pair = _LABEL.match(block, at)
        if pair is None or pair.end() == at:
            raise MetricsParseError(f"malformed Prometheus text: labels of {line!r}")
        value = pair.group(2)
        if "\\" in value:
            value = _ESCAPES.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1), value)
        labels[pair.group(1)] = value
        at = pair.end()
    return labels


def _number(text: str, line: str) -> float:
    try:
        return float(text)  # Python reads "+Inf", "-Inf" and "NaN" as Prometheus writes them
    except ValueError:
        raise MetricsParseError(f"malformed Prometheus text: {line!r}") from None


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
