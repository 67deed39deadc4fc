"""One experiment cell's figures: the Locust request log plus vLLM's counters.

Client-side figures (time to first token, session-steps per minute, prompt tokens from each
reply's ``usage``) come from the JSON lines the Locust users write; server-side ones
(prefix-cache hit rate, queue time, preemptions, KV usage, vLLM's own TTFT) from the
replicas' ``/metrics`` scraped around and during the load.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from loadtests.plan import Cell
from loadtests.prefix_losses import prefix_losses
from loadtests.vllm_metrics import (
    KV_USAGE,
    PREEMPTIONS,
    PROMPT_TOKENS,
    QUEUE_TIME,
    TTFT,
    WAITING,
    Window,
)
from offline.locust_runs import percentile

# Every column of a result row, in order (the e2e test checks each is filled).
METRICS = (
    "requests_ok",
    "requests_failed",
    "duration_s",
    "session_steps_per_min",
    "ttft_p50_ms",
    "ttft_p95_ms",
    "ttlt_p50_ms",
    "prompt_tokens",
    "prompt_tokens_per_step",
    "cached_tokens",
    "vllm_prefix_hit_rate",
    "vllm_prompt_tokens",
    "vllm_queue_time_mean_s",
    "vllm_queue_time_p95_s",
    "vllm_ttft_p50_s",
    "vllm_ttft_p95_s",
    "vllm_preemptions",
    "vllm_kv_usage_mean",
    "vllm_kv_usage_max",
    "vllm_waiting_mean",
    "vllm_waiting_max",
    "session_time_mean_s",
    "session_time_p95_s",
    "prefix_reusable",
    "prefix_lost_moved",
    "prefix_lost_after_wait",
    "prefix_lost_other",
    "reprefills_per_session",
)
# Filled for gateway cells only (the no-gateway arm has no gateway headers).
GATEWAY_METRICS = ("raw_prompt_tokens", "rendered_prompt_tokens", "admission_wait_max_s")
# The front's CPU over the load phase (the gateway or vllm-router with their child
# processes; empty for the no-gateway arm): what it takes from replicas that share its cores.
FRONT_METRICS = ("front_cpu_s", "front_cpu_ms_per_step")


def front_cpu(cpu_s: float | None, steps: int) -> dict[str, float | None]:
    """``FRONT_METRICS`` of a cell whose front used ``cpu_s`` CPU seconds for ``steps``
    completed steps (None: the cell has no front)."""
    if cpu_s is None:
        return dict.fromkeys(FRONT_METRICS)
    per_step = round(cpu_s * 1000 / steps, 2) if steps else None
    return {"front_cpu_s": round(cpu_s, 2), "front_cpu_ms_per_step": per_step}


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def session_times(requests: Sequence[dict[str, Any]]) -> list[float]:
    """Seconds from each session's first request to its last reply's end, for the sessions
    whose every logged request streamed to the end (a failed one did not complete)."""
    spans: dict[str, list[float]] = {}
    failed = {r["session"] for r in requests if not r["ok"]}
    for r in requests:
        if r["session"] not in failed:
            span = spans.setdefault(r["session"], [r["start"], r["end"]])
            span[0], span[1] = min(span[0], r["start"]), max(span[1], r["end"])
    return [end - start for start, end in spans.values()]


def capacity(stage_rows: Sequence[dict[str, Any]], ttft_p95_bound_ms: float) -> int:
    """The most concurrent sessions a step load served with client TTFT p95 under the bound
    and no failed request: the users of the last stage before the first that broke it
    (0 when the first stage already did)."""
    served = 0
    for stage in stage_rows:
        p95 = stage.get("ttft_p95_ms")
        if p95 is None or p95 > ttft_p95_bound_ms or stage.get("failed"):
            break
        served = stage["users"]
    return served


def summarize(
    cell: Cell, window: Window, requests: list[dict[str, Any]], block_size: int
) -> dict[str, Any]:
    ok = [r for r in requests if r["ok"]]
    duration = (
        max(r["end"] for r in requests) - min(r["start"] for r in requests) if requests else 0.0
    )
    ttft = [r["ttft_ms"] for r in ok if r["ttft_ms"] is not None]
    prompt = sum(r["prompt_tokens"] or 0 for r in ok)
    queue = window.histogram(QUEUE_TIME)
    vllm_ttft = window.histogram(TTFT)
    kv = [v for _, values in window.gauge_series(KV_USAGE) for v in values]
    waiting = [sum(values) for _, values in window.gauge_series(WAITING)]
    sessions = session_times(requests) if cell.load == "sessions" else []
    row: dict[str, Any] = {
        **cell.to_json(),
        "requests_ok": len(ok),
        "requests_failed": len(requests) - len(ok),
        "duration_s": round(duration, 2),
        "session_steps_per_min": round(len(ok) / duration * 60, 2) if duration else None,
        "ttft_p50_ms": percentile(ttft, 0.5),
        "ttft_p95_ms": percentile(ttft, 0.95),
        "ttlt_p50_ms": percentile([r["ttlt_ms"] for r in ok], 0.5),
        "prompt_tokens": prompt,
        "prompt_tokens_per_step": round(prompt / len(ok), 1) if ok else None,
        "cached_tokens": sum(r["cached_tokens"] or 0 for r in ok),
        "vllm_prefix_hit_rate": window.prefix_hit_rate,
        "vllm_prompt_tokens": window.counter(PROMPT_TOKENS),
        "vllm_queue_time_mean_s": queue.mean,
        "vllm_queue_time_p95_s": queue.quantile(0.95),
        "vllm_ttft_p50_s": vllm_ttft.quantile(0.5),
        "vllm_ttft_p95_s": vllm_ttft.quantile(0.95),
        "vllm_preemptions": window.counter(PREEMPTIONS),
        "vllm_kv_usage_mean": _mean(kv),
        "vllm_kv_usage_max": max(kv, default=None),
        "vllm_waiting_mean": _mean(waiting),
        "vllm_waiting_max": max(waiting, default=None),
        "session_time_mean_s": _mean(sessions),
        "session_time_p95_s": percentile(sessions, 0.95),
        **asdict(prefix_losses(requests, block_size)),
        "raw_prompt_tokens": None,
        "rendered_prompt_tokens": None,
        "admission_wait_max_s": None,
    }
    if cell.arm == "gateway":
        row["raw_prompt_tokens"] = sum(r["raw_prompt_tokens"] or 0 for r in ok)
        row["rendered_prompt_tokens"] = sum(r["rendered_prompt_tokens"] or 0 for r in ok)
        # From each reply's x-foldgate-admission-wait: the wait itself, not a bucket bound.
        row["admission_wait_max_s"] = max(
            (r.get("admission_wait_s") or 0.0 for r in requests), default=0.0
        )
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}
