"""The simulator's outputs, in the columns the Locust experiments report: a CSV row and a
JSON record per cell, a markdown table, and plots (KV usage over time; hit rate, p95 queue
time and throughput per cell)."""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from offline.sim.result import CellResult

COLUMNS: tuple[tuple[str, str], ...] = (
    ("policy", "policy"),
    ("strategy", "strategy"),
    ("load", "load"),
    ("requests", "requests"),
    ("prefix_hit_rate", "prefix hit"),
    ("queue_mean_s", "queue mean s"),
    ("queue_p95_s", "queue p95 s"),
    ("ttft_mean_s", "TTFT mean s"),
    ("ttft_p95_s", "TTFT p95 s"),
    ("session_steps_per_min", "steps/min"),
    ("preemptions", "preemptions"),
    ("moves", "moves"),
    ("kv_usage_mean", "KV mean"),
    ("kv_usage_max", "KV max"),
    ("admission_wait_max_s", "admission wait max s"),
)
# Only cells whose replicas have a CPU offload tier report it (CellResult.offload).
OFFLOAD_COLUMN = ("offload_hit_rate", "offload hit")


def _columns(rows: Sequence[Mapping[str, Any]]) -> tuple[tuple[str, str], ...]:
    if any(OFFLOAD_COLUMN[0] in r for r in rows):
        return (*COLUMNS, OFFLOAD_COLUMN)
    return COLUMNS


def _cell(key: str, value: Any) -> str:
    if key in ("prefix_hit_rate", "offload_hit_rate") or key.startswith("kv_usage"):
        return f"{100 * value:.1f}%"
    if isinstance(value, float):
        return f"{value:,.2f}" if key.endswith("_s") else f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
    columns = _columns(rows)
    head = "| " + " | ".join(label for _, label in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(_cell(k, r.get(k, 0.0)) for k, _ in columns) + " |" for r in rows]
    return "\n".join([head, rule, *body])


def write_outputs(
    results: Sequence[CellResult],
    out: Path,
    setup: Mapping[str, Any],
    command: str,
    extra: str = "",
) -> list[Path]:
    """Write results.csv, results.json, report.md (with ``extra`` markdown after the
    table's notes) and plots into ``out``; and requests.jsonl, one line per measured request
    of every cell (``RequestRecord`` with the cell's policy, strategy and load), where the
    cells kept them."""
    out.mkdir(parents=True, exist_ok=True)
    rows = [r.summary() for r in results]
    written = []
    csv_path = out / "results.csv"
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[k for k, _ in _columns(rows)])
        writer.writeheader()
        writer.writerows(rows)
    written.append(csv_path)
    json_path = out / "results.json"
    json_path.write_text(
        json.dumps(
            {
                "setup": dict(setup),
                "command": command,
                "cells": [
                    {**row, "kv_series": {"t": r.kv_time, "mean": r.kv_mean, "max": r.kv_max}}
                    for row, r in zip(rows, results, strict=True)
                ],
            },
            indent=1,
        )
    )
    written.append(json_path)
    if any(r.request_log for r in results):
        log_path = out / "requests.jsonl"
        with log_path.open("w") as f:
            for r in results:
                cell = {"policy": r.policy, "strategy": r.strategy, "load": r.load}
                for record in r.request_log:
                    f.write(json.dumps({**cell, **asdict(record)}) + "\n")
        written.append(log_path)
    md_path = out / "report.md"
    setup_lines = "\n".join(f"- {k}: {v}" for k, v in setup.items())
    md_path.write_text(
        f"# foldgate simulate\n\n```\n{command}\n```\n\n{setup_lines}\n\n"
        f"{markdown_table(rows)}\n\n"
        "Prefix hit: the replicas' prefix-cache hits over queries in tokens, as vLLM counts "
        "them (a preempted request is queried again when it resumes). Queue: arrival at the "
        "replica to first scheduled step. TTFT: the client's send to first token. Steps/min: "
        "requests "
        "completed per simulated minute after warm-up. Moves: sessions re-homed by the "
        "policy. KV: the replicas' KV usage (cached unreferenced blocks count free), mean "
        "over replicas and scrapes, and the highest one seen."
        + (
            " Offload hit: the prompt tokens loaded from the replicas' CPU offload tier past "
            "their GPU hit (vLLM's external_prefix_cache_hits), of every token queried."
            if len(_columns(rows)) > len(COLUMNS)
            else ""
        )
        + "\n\n"
        + (f"{extra}\n\n" if extra else "")
        + "![KV usage](kv_usage.png)\n\n![cells](cells.png)\n"
    )
    written.append(md_path)
    written.extend(_plots(results, out))
    return written


def _plots(results: Sequence[CellResult], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5))
    for r in results:
        ax.plot(r.kv_time, [100 * u for u in r.kv_mean], label=f"{r.policy}/{r.strategy}/{r.load}")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("KV usage, mean over replicas (%)")
    ax.legend(fontsize=7)
    kv_path = out / "kv_usage.png"
    fig.tight_layout()
    fig.savefig(kv_path, dpi=110)
    plt.close(fig)

    labels = [f"{r.policy}\n{r.strategy}\n{r.load}" for r in results]
    rows = [r.summary() for r in results]
    fig, axes = plt.subplots(3, 1, figsize=(max(8, 0.9 * len(results)), 10))
    panels = (
        ("prefix_hit_rate", "prefix hit rate", 100.0),
        ("queue_p95_s", "queue time p95 (s)", 1.0),
        ("session_steps_per_min", "session-steps / min", 1.0),
    )
    for ax, (key, title, scale) in zip(axes, panels, strict=True):
        ax.bar(range(len(rows)), [scale * row[key] for row in rows])
        ax.set_xticks(range(len(rows)), labels, fontsize=6)
        ax.set_title(title)
    cells_path = out / "cells.png"
    fig.tight_layout()
    fig.savefig(cells_path, dpi=110)
    plt.close(fig)
    return [kv_path, cells_path]
