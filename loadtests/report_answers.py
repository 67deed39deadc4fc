"""The report's answers to the three questions the experiments exist for, from the rows as
measured (whichever arm wins): prefix-cache hits by routing, strategies against base, and
foldgate against no gateway under a step load."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from loadtests.report_tables import fmt, stage_table, table


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
            f"{fmt(new['vllm_queue_time_mean_s'], '{:.3f}')} vs "
            f"{fmt(least['vllm_queue_time_mean_s'], '{:.3f}')} s, client TTFT p95 "
            f"{fmt(new['ttft_p95_ms'], '{:.0f}')} vs {fmt(least['ttft_p95_ms'], '{:.0f}')} ms)"
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
                f"{fmt(k['ttft_p50_ms'], '{:.0f}')} ms, p95 {fmt(k['ttft_p95_ms'], '{:.0f}')} ms"
            )
    if not stepped:
        out.append("- not measured in this profile (needs step-load cells)")
    out.append("")
    for r in stepped:
        out += [f"Stages of {r['cell']}:", "", stage_table(r.get("stages", [])), ""]
    return out
