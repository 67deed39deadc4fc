"""The report's tables: rows of cells, and a step load's stages, as Markdown."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def fmt(value: Any, pattern: str) -> str:
    if value is None:
        return "–"
    try:
        return pattern.format(int(value) if pattern in ("{:d}", "{:,}") else value)
    except (TypeError, ValueError):
        return str(value)


def table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str, str]]) -> str:
    head = "| cell | " + " | ".join(h for _, h, _ in columns) + " |"
    rule = "|---" * (len(columns) + 1) + "|"
    body = [
        f"| {r['cell']} | " + " | ".join(fmt(r.get(k), f) for k, _, f in columns) + " |"
        for r in rows
    ]
    return "\n".join([head, rule, *body])


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
