"""One experiment cell's figures: the Locust request log plus vLLM's counters.

Client-side figures (time to first token, session-steps per minute, prompt tokens from each
reply's ``usage``) come from the JSON lines the Locust users write; server-side ones
(prefix-cache hit rate, queue time, preemptions, KV usage, vLLM's own TTFT) from the
replicas' ``/metrics`` scraped around and during the load.
"""

from __future__ import annotations

import csv
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtests.plan import Cell
from loadtests.vllm_metrics import (
    KV_USAGE,
    PREEMPTIONS,
    PROMPT_TOKENS,
    QUEUE_TIME,
    TTFT,
    WAITING,
    Window,
)

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
)
# Filled for gateway cells only (the no-gateway arm has no gateway headers).
GATEWAY_METRICS = ("raw_prompt_tokens", "rendered_prompt_tokens")


def load_requests(cell_dir: Path) -> list[dict[str, Any]]:
    """Every request the cell's Locust processes logged (workers write one file each)."""
    records = []
    for path in sorted(cell_dir.glob("requests.jsonl*")):
        records += [json.loads(line) for line in path.read_text().splitlines() if line]
    return records


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def summarize(cell: Cell, window: Window, requests: list[dict[str, Any]]) -> dict[str, Any]:
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
        "raw_prompt_tokens": None,
        "rendered_prompt_tokens": None,
    }
    if cell.arm == "gateway":
        row["raw_prompt_tokens"] = sum(r["raw_prompt_tokens"] or 0 for r in ok)
        row["rendered_prompt_tokens"] = sum(r["rendered_prompt_tokens"] or 0 for r in ok)
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}


def load_user_counts(history_csv: Path) -> list[tuple[float, int]]:
    """``(unix time, users)`` of each second, from Locust's ``_stats_history.csv``."""
    with history_csv.open() as f:
        return [
            (float(row["Timestamp"]), int(row["User Count"]))
            for row in csv.DictReader(f)
            if row["Name"] == "Aggregated"
        ]


def stages(
    requests: list[dict[str, Any]],
    user_counts: Sequence[tuple[float, int]],
    stage_s: float | None = None,
) -> list[dict[str, Any]]:
    """Per stage of a step load: users, completed session-steps per minute, client TTFT.

    A stage starts at the first second Locust reported a user count above every earlier one
    (users leaving while the run stops are no stage) and runs to the next stage's start;
    the last one runs ``stage_s`` (the shape's stage length), or to Locust's last report
    when not given. Throughput counts the requests that ended in the stage; TTFT those that
    started in it, i.e. were sent under that load.
    """
    starts: dict[int, float] = {}
    for at, users in user_counts:
        if users > max(starts, default=0):
            starts[users] = at
    if not starts:
        return []
    bounds = sorted(starts.items(), key=lambda item: item[1])
    last_end = max(at for at, _ in user_counts)
    if stage_s is not None:
        last_end = min(last_end, bounds[-1][1] + stage_s)
    ends = [at for _, at in bounds[1:]] + [last_end]
    out = []
    for i, ((users, begin), end) in enumerate(zip(bounds, ends, strict=True)):
        done = [r for r in requests if begin <= r["end"] < end]
        ok = [r for r in done if r["ok"]]
        sent = [r for r in requests if begin <= r["start"] < end and r["ok"]]
        ttft = [r["ttft_ms"] for r in sent if r["ttft_ms"] is not None]
        length = end - begin
        out.append(
            {
                "stage": i,
                "users": users,
                "seconds": round(length, 1),
                "session_steps_per_min": round(len(ok) / length * 60, 2) if length else 0.0,
                "failed": len(done) - len(ok),
                "ttft_p50_ms": percentile(ttft, 0.5),
                "ttft_p95_ms": percentile(ttft, 0.95),
            }
        )
    return out


def knee(stage_rows: list[dict[str, Any]], share: float = 0.9) -> dict[str, Any] | None:
    """The first stage that reaches ``share`` (90%) of the best stage's throughput: more
    users than that buy little, so queueing is all they add."""
    if not stage_rows:
        return None
    best = max(r["session_steps_per_min"] for r in stage_rows)
    return next(r for r in stage_rows if r["session_steps_per_min"] >= share * best)
