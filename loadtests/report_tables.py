"""The report's tables: rows of cells, and a step load's stages, as Markdown; several runs
of one cell as one row of means with their run-to-run spread."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from loadtests.plan import Cell

# Where a row keeps each figure's (min, max) over the runs it aggregates.
SPREAD = "spread"
# What names a cell, not a figure: never averaged.
_CELL_KEYS = frozenset({"run", *(f.name for f in fields(Cell))})


def fmt(value: Any, pattern: str) -> str:
    if value is None:
        return "–"
    try:
        return pattern.format(int(value) if pattern in ("{:d}", "{:,}") else value)
    except (TypeError, ValueError):
        return str(value)


def aggregate(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per cell, in first-run order: each numeric figure the mean over the cell's
    runs, its (min, max) under ``row["spread"]`` when there were several, ``runs`` the
    count; a step load's stages and knee are the first run's (its knee and capacity are
    means like the rest)."""
    by_cell: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_cell.setdefault(r["cell"], []).append(r)
    out = []
    for runs in by_cell.values():
        row = dict(runs[0])
        row["runs"] = len(runs)
        spread: dict[str, tuple[float, float]] = {}
        for key, value in runs[0].items():
            values = [r.get(key) for r in runs]
            if key in _CELL_KEYS or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            numbers = [v for v in values if isinstance(v, int | float)]
            if not numbers:
                continue
            row[key] = statistics.fmean(numbers)
            if len(numbers) > 1:
                spread[key] = (min(numbers), max(numbers))
        knees = [r["knee"]["session_steps_per_min"] for r in runs if r.get("knee")]
        if knees:
            row["knee_steps_per_min"] = statistics.fmean(knees)
            if len(knees) > 1:
                spread["knee_steps_per_min"] = (min(knees), max(knees))
        row[SPREAD] = spread
        out.append(row)
    return out


def cell_value(row: dict[str, Any], key: str, pattern: str) -> str:
    """A figure, with its run-to-run range when the row aggregates several runs."""
    text = fmt(row.get(key), pattern)
    low_high = row.get(SPREAD, {}).get(key)
    if low_high is None:
        return text
    return f"{text} ({fmt(low_high[0], pattern)}–{fmt(low_high[1], pattern)})"


def table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str, str]]) -> str:
    """Cells as Markdown rows, each with its arm's label; a figure aggregated over several
    runs is shown as ``mean (min–max)``."""
    head = "| cell | arm | " + " | ".join(h for _, h, _ in columns) + " |"
    rule = "|---" * (len(columns) + 2) + "|"
    body = [
        f"| {r['cell']} | {arm_label(r)} | "
        + " | ".join(cell_value(r, k, f) for k, _, f in columns)
        + " |"
        for r in rows
    ]
    return "\n".join([head, rule, *body])


def arm_label(row: dict[str, Any]) -> str:
    """The arm as a reader names it (``Cell.label``), from a result row."""
    if row["arm"] == "no_gateway":
        return "straight round-robin"
    if row["arm"] == "vllm_router":
        return f"vllm-router {row['router_policy']}"
    variant = f" [{row['variant']}]" if row.get("variant") else ""
    return f"foldgate {row['routing']} ({row['strategy']}){variant}"


def stage_table(stage_rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| users | seconds | steps/min | failed | TTFT p50 ms | TTFT p95 ms |",
        "|---|---|---|---|---|---|",
    ]
    for s in stage_rows:
        lines.append(
            f"| {s['users']} | {s['seconds']:.0f} | {s['session_steps_per_min']:.1f} | "
            f"{s['failed']} | "
            f"{fmt(s['ttft_p50_ms'], '{:.0f}')} | {fmt(s['ttft_p95_ms'], '{:.0f}')} |"
        )
    return "\n".join(lines)
