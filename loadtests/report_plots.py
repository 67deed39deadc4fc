"""The report's PNG plots: per-cell figures, KV usage over time, a step load's stages."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

BAR_PLOTS = (
    ("vllm_prefix_hit_rate", "prefix-cache hit rate (vLLM)"),
    ("vllm_queue_time_mean_s", "queue time mean (s)"),
    ("vllm_queue_time_p95_s", "queue time p95, bucket bound (s)"),
    ("ttft_p50_ms", "TTFT p50 (ms, client)"),
    ("ttft_p95_ms", "TTFT p95 (ms, client)"),
    ("session_steps_per_min", "session-steps per minute"),
    ("prompt_tokens", "upstream prompt tokens"),
    ("vllm_preemptions", "preemptions"),
)


# foldgate green, vllm-router blue, the straight round-robin grey.
ARM_COLORS = {"gateway": "#2a6", "vllm_router": "#36c", "no_gateway": "#888"}


def plot_bars(rows: Sequence[dict[str, Any]], path: Path) -> None:
    fig, axes = plt.subplots(len(BAR_PLOTS) // 2, 2, figsize=(14, 3.2 * len(BAR_PLOTS) // 2))
    names = [r["cell"] for r in rows]
    for ax, (key, title) in zip(axes.flat, BAR_PLOTS, strict=True):
        values = [r.get(key) or 0 for r in rows]
        ax.barh(names, values, color=[ARM_COLORS.get(r["arm"], "#2a6") for r in rows])
        ax.set_title(title, fontsize=10)
        ax.tick_params(axis="y", labelsize=7)
        ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_kv_usage(rows: Sequence[dict[str, Any]], out: Path, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(10, 4))
    for r in rows:
        scrapes = json.loads((out / r["cell"] / "scrapes.json").read_text())
        rounds = [rd for rd in scrapes["during"] if rd]
        if not rounds:
            continue
        t0 = rounds[0][0]["at"]
        xs = [rd[0]["at"] - t0 for rd in rounds]
        ys = [max(s["values"].get("vllm:kv_cache_usage_perc", 0.0) for s in rd) for rd in rounds]
        ax.plot(xs, ys, label=r["cell"])
    ax.set_xlabel("seconds into the load")
    ax.set_ylabel("KV cache usage (busiest replica)")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_steps(rows: Sequence[dict[str, Any]], path: Path) -> None:
    fig, (thr, lat) = plt.subplots(1, 2, figsize=(11, 4))
    for r in rows:
        st = r.get("stages") or []
        users = [s["users"] for s in st]
        thr.plot(users, [s["session_steps_per_min"] for s in st], marker="o", label=r["cell"])
        lat.plot(users, [s["ttft_p50_ms"] or 0 for s in st], marker="o", label=r["cell"])
    thr.set(xlabel="users", ylabel="session-steps per minute", title="throughput")
    lat.set(xlabel="users", ylabel="TTFT p50 (ms)", title="time to first token")
    thr.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
