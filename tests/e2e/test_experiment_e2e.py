"""A two-cell experiment on real vLLM-CPU replicas: foldgate (sticky, base) and the
no-gateway arm, Locust replaying a small recorded session. The cells share a KV pool, so the
second reuses the first's replica after vLLM's prefix cache is reset.

Kept cheap for CI: one replica (started once), two sessions of three steps, 8 decoded tokens.
"""

from __future__ import annotations

import csv
import json
import uuid
from pathlib import Path

import pytest

from loadtests.experiment import run_profile
from loadtests.plan import load_profile
from loadtests.results import FRONT_METRICS, GATEWAY_METRICS, METRICS
from tests.e2e.conftest import SERVED_NAME

pytestmark = pytest.mark.e2e

USERS = 2
STEPS = 3


def trajectory(tag: str, n: int) -> dict:
    """A normalized (OpenAI chat) run with STEPS replies and long-ish tool outputs."""
    messages = [
        {"role": "system", "content": f"[{tag}-{n}] You are a coding agent. " * 20},
        {"role": "user", "content": f"[{tag}-{n}] Fix the failing test in pkg/mod.py."},
    ]
    for step in range(STEPS):
        call = {
            "id": f"c{step}",
            "type": "function",
            "function": {"name": "read", "arguments": json.dumps({"path": f"pkg/m{step}.py"})},
        }
        messages.append({"role": "assistant", "content": f"Reading m{step}.", "tool_calls": [call]})
        body = "".join(f"def f{step}_{i}(x):\n    return x + {i}\n" for i in range(40))
        messages.append({"role": "tool", "tool_call_id": f"c{step}", "content": body})
    messages.append({"role": "assistant", "content": "Done."})
    return {"id": f"{tag}-{n}", "format": "native_tool_calls", "messages": messages}


def config(tmp_path: Path, runs: Path) -> Path:
    path = tmp_path / "experiments.toml"
    path.write_text(
        f"""
[defaults]
trajectories = ["{runs}"]
model = "{SERVED_NAME}"
replicas = 1
max_steps = {STEPS}
max_tokens_cap = 8
think_time = "0"
block_size = 32
max_model_len = 4096
run_time_s = 120
scrape_interval_s = 1
arm = "gateway"
strategy = "base"
routing = "sticky"
server = "uvicorn"
users = {USERS}
kv_cache_bytes = "8M"
load = "sessions"

[profiles.ci]
description = "two cells: foldgate and no gateway"
[[profiles.ci.matrix]]
arm = ["gateway", "no_gateway"]
"""
    )
    return path


def test_two_cell_experiment_reports_every_metric_for_both_cells(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:8]
    runs = tmp_path / "runs.jsonl"
    runs.write_text("".join(json.dumps(trajectory(tag, n)) + "\n" for n in range(USERS)))
    profile = load_profile("ci", config(tmp_path, runs))
    out = tmp_path / "out"
    run_profile(profile, out)

    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [r["arm"] for r in rows] == ["gateway", "no_gateway"]
    assert [r["fresh_replicas"] for r in rows] == ["True", "False"]
    for row in rows:
        missing = [m for m in METRICS if row[m] in ("", "None")]
        assert not missing, (row["cell"], missing)
        assert int(row["requests_ok"]) == USERS * STEPS and int(row["requests_failed"]) == 0
        # fixed work, no pressure: vLLM counted exactly the prompts the users were told of
        assert float(row["vllm_prompt_tokens"]) == int(row["prompt_tokens"])
        assert 0 < float(row["vllm_prefix_hit_rate"]) < 1
        cell_dir = out / row["cell"]
        for name in ("locust_stats.csv", "requests.jsonl", "scrapes.json"):
            assert (cell_dir / name).is_file(), name
        replies = [json.loads(line) for line in (cell_dir / "requests.jsonl").open()]
        # ignore_eos reached vLLM (through the gateway too): every reply decoded max_tokens
        assert all(r["completion_tokens"] == r["max_tokens"] for r in replies), replies
        # no cell inherits another's cache: the second cell replays the first's prompts on
        # the same replica, yet each session's first request starts cold (the sessions
        # share no leading block: the tag opens each system prompt)
        firsts = [r for r in replies if r["step"] == 0]
        assert len(firsts) == USERS and all(r["cached_tokens"] == 0 for r in firsts), firsts
        # Locust's own statistics hold every request, its last second's too
        locust_counts = {
            r["Name"]: int(r["Request Count"])
            for r in csv.DictReader((cell_dir / "locust_stats.csv").open())
        }
        for name in ("time_to_first_token", "prompt_tokens", "cached_tokens"):
            assert locust_counts.get(name) == USERS * STEPS, (name, locust_counts)
    gateway_row = rows[0]
    assert all(gateway_row[m] not in ("", "None") for m in GATEWAY_METRICS)
    # The gateway's CPU over the load is counted; the no-gateway arm has no front.
    assert float(gateway_row["front_cpu_s"]) > 0 and float(gateway_row["front_cpu_ms_per_step"]) > 0
    assert all(rows[1][m] in ("", "None") for m in FRONT_METRICS)
    report = (out / "report.md").read_text()
    for row in rows:
        assert row["cell"] in report
    for plot in ("metrics.png", "kv_usage.png"):
        assert (out / plot).stat().st_size > 0
    assert "## Answers" in report and "Real here" in report
