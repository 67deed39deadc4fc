"""Prometheus metrics of the request pipeline (routing metrics live in ``router``)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import Counter, Gauge, Histogram

from gateway.fold.spec import StrategySpec, parse_spec

# Labels take a bounded set of values: a client's header must not mint a series per value.
MAX_LABELLED_PARTS = 2
OTHER = "other"


def strategy_label(spec: str | StrategySpec) -> str:
    """``spec`` when it names known strategies (at most two composed), else "other"."""
    try:
        parsed = parse_spec(spec)
    except ValueError:
        return OTHER
    return str(parsed) if len(parsed.parts) <= MAX_LABELLED_PARTS else OTHER


REQUESTS = Counter(
    "foldgate_requests_total",
    "Requests by dialect, strategy and status",
    ["dialect", "strategy", "status"],
)
PROMPT_TOKENS = Counter(
    "foldgate_prompt_tokens_total",
    "Prompt tokens before (raw) and after (rendered) rendering, estimated by the gateway",
    ["kind"],
)
UPSTREAM_CACHED_TOKENS = Counter(
    "foldgate_upstream_cached_tokens_total", "Prompt tokens the upstream reported as prefix-cached"
)
UPSTREAM_PROMPT_TOKENS = Counter(
    "foldgate_upstream_prompt_tokens_total", "Prompt tokens the upstream reported"
)
STUBS = Counter("foldgate_stubs_total", "Duplicate spans replaced by stubs in rendered contexts")
FOLDS = Counter("foldgate_folded_steps_total", "Steps rendered as fold notes")
RENDER_TOKENS = Counter(
    "foldgate_render_tokens_total",
    "Where the rendering's tokens went (gateway estimate), summed over requests: what the "
    "strategy added (protocol text, labels, notes, its restore tool), what its stubs and folds "
    "removed, and the cached tokens its rewrites made the replica prefill again",
    ["kind"],
)
RESTORES = Counter("foldgate_restores_total", "Restore calls answered inside the gateway", ["mode"])
RENDER_SECONDS = Histogram(
    "foldgate_render_seconds",
    "Time to render one request's context",
    buckets=(0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0),
)
ADDED_SECONDS = Histogram(
    "foldgate_added_latency_seconds",
    "Time from a request's arrival to its upstream request: what the gateway adds before the "
    "model starts (body read, decode, ingest, render, encode)",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.3, 1.0),
)
UPSTREAM_ERRORS = Counter(
    "foldgate_upstream_errors_total", "Upstream attempts that failed", ["kind"]
)
ACCOUNTING_LOST = Counter(
    "foldgate_accounting_lost_total",
    "Requests whose accounting (counters, request log) was not written, by why: the store "
    "stayed unavailable over every retry, the task was cancelled, or an unexpected error",
    ["reason"],
)
OVERFLOW_RETRIES = Counter(
    "foldgate_overflow_retries_total",
    "Retries with a compacted context after the upstream refused one as too long",
)
CACHE_EVICTIONS = Counter(
    "foldgate_session_cache_evictions_total",
    "Sessions dropped from a per-session cache to keep it within its byte bound",
    ["cache"],
)
CACHE_BYTES = Gauge(
    "foldgate_session_cache_bytes",
    "Memory a per-session cache keeps alive, in bytes (the gateway's measured estimate)",
    ["cache"],
)


def cache_callbacks(name: str) -> dict[str, Callable[[int], None]]:
    """``gateway.lru.LRU``'s callbacks that export a cache's evictions and the bytes it
    holds as the series labelled ``name``."""
    evictions = CACHE_EVICTIONS.labels(cache=name)
    held = CACHE_BYTES.labels(cache=name)
    return {"on_evict": lambda _size: evictions.inc(), "on_size": held.set}


ADMISSION_PREFILL_PRICE = Gauge(
    "foldgate_admission_prefill_price_seconds",
    "Seconds one uncached prompt token costs as working-set admission prices restores: the "
    "cost model's figure, or with admission_price_fit the replies' fitted one "
    "(router.prefill_price)",
)
ADMISSION_WAIT_SECONDS = Histogram(
    "foldgate_admission_wait_seconds",
    "Time a request waited at the gateway for its session to enter its replica's working set "
    "(gateway.steps.working_set), by outcome: admitted (no wait), waited, priced (went before "
    "room came: waiting cost more than going), timed_out (went after admission_max_wait_s)",
    ["outcome"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0),
)
ADMISSION_WAITING = Gauge(
    "foldgate_admission_waiting", "Requests waiting now for their session's working-set admission"
)
UPSTREAM_PRIORITY = Counter(
    "foldgate_upstream_priority",
    "Upstream requests by the priority class the gateway sent (warm: a continuing session "
    "whose prefix is on its replica; cold: a cold start)",
    ["class"],
)
