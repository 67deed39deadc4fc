"""A Locust run's records, read back: the request log its users wrote, the user counts
Locust reported, and a step load's stages and knee.

The experiments (``loadtests``) summarize their cells with these, and the simulator's
calibration (``offline.sim``) reads the same logs and judges by the same knee, so both
live here, below both.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


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
