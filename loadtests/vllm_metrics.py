"""vLLM's own counters, gauges and histograms, scraped from each replica's ``/metrics``.

An experiment scrapes every replica before the load, every few seconds during it, and
after it. Counters and histograms are read as differences between two scrapes (a cell's
replicas are fresh, but the difference also excludes warm-up probes); gauges as a time
series. The page is read by ``router.metrics.parse_metrics_page`` (the router's parser):
samples of one metric that differ only in labels (model, engine) are summed; the KV-cache
usage fraction is averaged over engines and summed over replicas only as a mean.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import httpx

from router.metrics import parse_metrics_page

PREFIX_HITS = "vllm:prefix_cache_hits_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREEMPTIONS = "vllm:num_preemptions_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
KV_USAGE = "vllm:kv_cache_usage_perc"
WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
QUEUE_TIME = "vllm:request_queue_time_seconds"
TTFT = "vllm:time_to_first_token_seconds"
COUNTERS = (PREFIX_HITS, PREFIX_QUERIES, PREEMPTIONS, PROMPT_TOKENS)
GAUGES = (KV_USAGE, WAITING, RUNNING)
HISTOGRAMS = (QUEUE_TIME, TTFT)
# The gateway's own (branch kv, /work/coord/kv-knobs.md): seconds a request waited for
# working-set admission, labelled by outcome.


@dataclass(frozen=True)
class Histogram:
    """Cumulative bucket counts (upper bound -> count), sum and count."""

    buckets: dict[float, float]
    sum: float
    count: float

    def minus(self, earlier: Histogram) -> Histogram:
        return Histogram(
            {le: n - earlier.buckets.get(le, 0.0) for le, n in self.buckets.items()},
            self.sum - earlier.sum,
            self.count - earlier.count,
        )

    def plus(self, other: Histogram) -> Histogram:
        keys = set(self.buckets) | set(other.buckets)
        return Histogram(
            {le: self.buckets.get(le, 0.0) + other.buckets.get(le, 0.0) for le in keys},
            self.sum + other.sum,
            self.count + other.count,
        )

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count else None

    def quantile(self, q: float) -> float | None:
        """An upper bound of the q-quantile: the bound of the bucket that holds rank q.

        Not Prometheus' interpolation: vLLM's queue-time buckets are coarse (the first ends
        at 0.3 s), and interpolating inside one would report 0.285 s for requests that
        never queued.
        """
        if not self.count:
            return None
        rank = q * self.count
        finite = [le for le in sorted(self.buckets) if not math.isinf(le)]
        for le in finite:
            if self.buckets[le] >= rank:
                return le
        return finite[-1] if finite else None  # above the largest finite bound


EMPTY_HISTOGRAM = Histogram({}, 0.0, 0.0)


@dataclass(frozen=True)
class Scrape:
    """One replica's page at one time."""

    url: str
    at: float
    values: dict[str, float]
    histograms: dict[str, Histogram]


def parse(url: str, text: str, at: float) -> Scrape:
    page = parse_metrics_page(text)
    values = {name: page.totals[name] for name in (*COUNTERS, *GAUGES) if name in page.totals}
    if KV_USAGE in values:
        values[KV_USAGE] /= page.label_sets[KV_USAGE]
    histograms = {
        name: Histogram(
            page.buckets.get(name, {}),
            page.totals.get(f"{name}_sum", 0.0),
            page.totals.get(f"{name}_count", 0.0),
        )
        for name in HISTOGRAMS
    }
    return Scrape(url, at, values, histograms)


def scrape(url: str, client: httpx.Client | None = None, timeout: float = 10.0) -> Scrape:
    getter = client.get if client is not None else httpx.get
    resp = getter(f"{url}/metrics", timeout=timeout)
    resp.raise_for_status()
    return parse(url, resp.text, time.time())


def scrape_all(urls: Iterable[str], client: httpx.Client | None = None) -> list[Scrape]:
    return [scrape(u, client) for u in urls]


@dataclass
class Window:
    """What the replicas did between two scrapes of each, plus the gauges in between."""

    before: Sequence[Scrape]
    after: Sequence[Scrape]
    during: list[list[Scrape]] = field(default_factory=list)  # one list per scrape round

    def counter(self, name: str) -> float:
        return sum(a.values.get(name, 0.0) - b.values.get(name, 0.0) for b, a in self._pairs())

    def histogram(self, name: str) -> Histogram:
        total = EMPTY_HISTOGRAM
        for b, a in self._pairs():
            total = total.plus(a.histograms[name].minus(b.histograms[name]))
        return total

    def gauge_series(self, name: str) -> list[tuple[float, list[float]]]:
        """(time, value per replica) for every scrape round during the load."""
        return [(r[0].at, [s.values.get(name, 0.0) for s in r]) for r in self.during if r]

    @property
    def prefix_hit_rate(self) -> float | None:
        queries = self.counter(PREFIX_QUERIES)
        return self.counter(PREFIX_HITS) / queries if queries else None

    def _pairs(self) -> list[tuple[Scrape, Scrape]]:
        by_url = {s.url: s for s in self.before}
        return [(by_url[a.url], a) for a in self.after]
