"""deploy/gpu/serve.sh in dry-run mode: the per-GPU command lines and its input checks."""

from __future__ import annotations

import os
import subprocess

from deploy.cpu.replicas import ROOT

SERVE = ROOT / "deploy" / "gpu" / "serve.sh"


def dry_run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SERVE), *args],
        env={"PATH": os.environ["PATH"], "DRY_RUN": "1", **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_one_replica_per_gpu_group() -> None:
    run = dry_run("org/model", GPUS="0,1,2,3", TP="2", BASE_PORT="9000")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("CUDA_VISIBLE_DEVICES=0,1 vllm serve org/model ")
    assert lines[1].startswith("CUDA_VISIBLE_DEVICES=2,3 vllm serve org/model ")
    assert "--port 9000" in lines[0] and "--port 9001" in lines[1]
    for flag in (
        "--tensor-parallel-size 2",
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--enable-auto-tool-choice --tool-call-parser qwen3_coder",
        "--reasoning-parser qwen3",
    ):
        assert all(flag in line for line in lines), flag


def test_parsers_and_extra_args_are_configurable() -> None:
    run = dry_run(GPUS="3", TOOL_PARSER="hermes", REASONING_PARSER="", EXTRA_ARGS="--seed 1")
    assert run.returncode == 0, run.stderr
    (line,) = run.stdout.splitlines()
    assert line.startswith("CUDA_VISIBLE_DEVICES=3 vllm serve Qwen/Qwen3.6-27B ")
    assert "--tool-call-parser hermes" in line and "--reasoning-parser" not in line
    assert line.endswith("--seed 1")


def test_bad_gpu_layouts_are_refused() -> None:
    uneven = dry_run(GPUS="0,1,2", TP="2")
    assert uneven.returncode == 1 and "3 GPUs do not split into TP=2 groups" in uneven.stderr
    bad_tp = dry_run(GPUS="0", TP="zero")
    assert bad_tp.returncode == 1 and "TP must be a positive integer" in bad_tp.stderr


def test_priority_scheduling_kv_events_and_the_offload_tier() -> None:
    run = dry_run("org/model", GPUS="0,1", BASE_PORT="8000")
    assert run.returncode == 0, run.stderr
    first, second = run.stdout.splitlines()
    assert "--scheduling-policy priority" in first
    # Each replica publishes its KV events on its port + 1000 (the gateway's default offset).
    assert '"endpoint":"tcp://*:9000"' in first and '"endpoint":"tcp://*:9001"' in second
    assert "--kv-offloading-size" not in first
    tiered = dry_run("org/model", GPUS="0", KV_OFFLOADING_SIZE="64", KV_EVENTS_PORT_OFFSET="")
    assert "--kv-offloading-size 64" in tiered.stdout and "--kv-events-config" not in tiered.stdout
