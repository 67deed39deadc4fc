"""A Locust run read back: its request logs, user counts, and a step load's stages."""

from __future__ import annotations

import json
from pathlib import Path

from offline.locust_runs import knee, load_requests, load_user_counts, stages


def test_request_logs_of_every_worker_are_read_in_file_order(tmp_path: Path) -> None:
    (tmp_path / "requests.jsonl").write_text(json.dumps({"n": 0}) + "\n\n")
    (tmp_path / "requests.jsonl.1").write_text(json.dumps({"n": 1}) + "\n" + json.dumps({"n": 2}))
    assert [r["n"] for r in load_requests(tmp_path)] == [0, 1, 2]


def test_user_counts_are_the_aggregated_rows_of_locusts_history(tmp_path: Path) -> None:
    history = tmp_path / "locust_stats_history.csv"
    history.write_text(
        "Timestamp,User Count,Name\n100,1,Aggregated\n100,1,/v1/chat/completions\n"
        "101,2,Aggregated\n"
    )
    assert load_user_counts(history) == [(100.0, 1), (101.0, 2)]


def test_stages_and_knee_of_a_step_load() -> None:
    def req(start: float, end: float, ok: bool = True) -> dict:
        return {"start": start, "end": end, "ok": ok, "ttft_ms": 10.0 * start}

    # Locust's per-second user counts: 1 user from t=100, 2 from t=110, 4 from t=125 to 135
    counts = [(100.0 + t, 1) for t in range(10)] + [(110.0 + t, 2) for t in range(15)]
    counts += [(125.0 + t, 4) for t in range(11)]
    requests = [req(101, 104), req(104, 109), req(108, 112)]  # ended: 2 in stage 1
    requests += [req(112, 118), req(113, 119), req(118, 124)]  # 4 in stage 2 (with 108-112)
    requests += [req(124, 127), req(126, 129, ok=False), req(127, 131)]  # stage 3
    rows = stages(requests, counts)
    assert [(r["users"], r["seconds"]) for r in rows] == [(1, 10.0), (2, 15.0), (4, 10.0)]
    assert [r["session_steps_per_min"] for r in rows] == [12.0, 16.0, 12.0]
    assert rows[2]["failed"] == 1
    assert rows[1]["ttft_p50_ms"] == 1180.0  # sent in stage 2: started 112, 113, 118, 124
    assert knee(rows)["users"] == 2
    # The run stops: users leave (4 -> 3, reported until t=142) and a straggler ends at
    # 137. Leaving users are no stage; the last stage lasts the shape's 10 s.
    counts += [(136.0 + t, 3) for t in range(7)]
    stopped = stages([*requests, req(130, 137)], counts, stage_s=10)
    assert [(r["users"], r["seconds"]) for r in stopped] == [(1, 10.0), (2, 15.0), (4, 10.0)]
    assert stopped[2]["session_steps_per_min"] == 12.0
