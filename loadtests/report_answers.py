"""The report's answers to the questions the experiments exist for, from the rows as
measured (whichever arm wins): prefix-cache hits by routing, strategies against base,
foldgate against no gateway under a step load, foldgate's default against the best
vllm-router policy (by the simulator comparison's tie rule), and each arm's capacity.
Every table shows the peer arms (vllm-router, straight round-robin) beside foldgate's."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from gateway.config import GatewayConfig
from loadtests.report_tables import arm_label, fmt, stage_table, table
from offline.sim.ordering import spread


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
ROUTING_COLUMNS = (
    ("vllm_prefix_hit_rate", "prefix hit", "{:.1%}"),
    *LOAD_COLUMNS,
    ("session_time_mean_s", "session time mean s", "{:.1f}"),
    ("admission_wait_max_s", "longest admission wait s", "{:.3f}"),
)
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


def _peers_of(rows: Sequence[dict[str, Any]], like: dict[str, Any]) -> list[dict[str, Any]]:
    """The peer arms' cells (vllm-router, straight round-robin) run with the same users,
    pool, think time and load as ``like``."""
    keys = ("users", "kv_cache_bytes", "think_time", "load")
    return [r for r in rows if r["arm"] != "gateway" and all(r.get(k) == like.get(k) for k in keys)]


def answers(
    rows: Sequence[dict[str, Any]],
    runs: Sequence[dict[str, Any]] = (),
    default_variant: str = "",
    ttft_p95_bound_ms: float | None = None,
) -> list[str]:
    """``rows``: one per cell (``report_tables.aggregate``); ``runs``: one per cell and run,
    for the run-to-run spread the tie rule reads (default: ``rows``)."""
    runs = runs or rows
    out = ["## Answers", ""]
    # 1. routing, same strategy and pool, fixed work
    out.append("### 1. Prefix-cache hit rate by routing (2 replicas)")
    routed = [r for r in rows if r["arm"] == "gateway" and r["load"] == "sessions"]
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in routed:
        key = (r["strategy"], r["users"], r["kv_cache_bytes"], r["server"], r.get("think_time"))
        groups.setdefault(key, []).append(r)
    measured = False
    for (strategy, users, kv, _, think), group in groups.items():
        peers = _peers_of(rows, group[0])
        if len({r["routing"] for r in group}) > 1 or peers:
            measured = True
            out += [
                f"{strategy}, {users} sessions, KV pool {kv / 2**20:.0f} MiB per replica, "
                f"think time `{think or '0'}`:",
                "",
                table(group + peers, ROUTING_COLUMNS),
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
                table(base + others + _peers_of(rows, base[0]), STRATEGY_COLUMNS),
                "",
            ]
    if not measured:
        out.append("- not measured in this profile (needs base and another strategy, sticky)")
    out.append("")
    # 3. step load: foldgate vs no gateway
    out.append("### 3. foldgate vs the peer arms (vllm-router, no gateway), step load")
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
    out += against_best_peer(rows, runs, default_variant)
    if stepped and ttft_p95_bound_ms is not None:
        out += capacity_answer(stepped, runs, ttft_p95_bound_ms)
    return out


# (figure, heading, format, higher is better) compared between foldgate's default and the
# best vllm-router policy: fixed-work cells, then step loads.
VERSUS_SESSIONS = (
    ("vllm_prefix_hit_rate", "prefix hit", "{:.1%}", True),
    ("ttft_p50_ms", "TTFT p50 ms", "{:.0f}", False),
    ("ttft_p95_ms", "TTFT p95 ms", "{:.0f}", False),
    ("session_steps_per_min", "steps/min", "{:.1f}", True),
    ("session_time_mean_s", "session time mean s", "{:.1f}", False),
)
VERSUS_STEPS = (
    ("knee_steps_per_min", "steps/min at the knee", "{:.1f}", True),
    ("capacity_users", "capacity (sessions)", "{:.1f}", True),
    ("vllm_prefix_hit_rate", "prefix hit", "{:.1%}", True),
)


def is_default(row: dict[str, Any], default_variant: str = "") -> bool:
    """The cell runs foldgate as shipped: GatewayConfig's default strategy and policy (and
    the profile's ``default_variant``, e.g. its KV mechanisms switched on)."""
    config = GatewayConfig()
    return (
        row["arm"] == "gateway"
        and row["strategy"] == config.strategy
        and row["routing"] == config.policy
        and (row.get("variant") or "") == default_variant
    )


def _per_run(runs: Sequence[dict[str, Any]], cell: str, key: str) -> list[float]:
    values = []
    for r in runs:
        if r["cell"] != cell:
            continue
        value = (
            r["knee"]["session_steps_per_min"]
            if key == "knee_steps_per_min" and r.get("knee")
            else r.get(key)
        )
        if isinstance(value, int | float):
            values.append(float(value))
    return values


def verdict(ours: list[float], theirs: list[float], higher_better: bool) -> str:
    """The simulator comparison's tie rule (``offline.sim.ordering``): ordered only when the
    means differ by more than either side's run-to-run spread (max - min)."""
    if not ours or not theirs:
        return "not measured"
    difference = statistics.fmean(ours) - statistics.fmean(theirs)
    if abs(difference) <= max(spread(ours), spread(theirs)):
        return "tie (within the runs' spread)"
    ahead = difference > 0 if higher_better else difference < 0
    one_run = " (one run each: no spread known)" if len(ours) == len(theirs) == 1 else ""
    return ("foldgate ahead" if ahead else "vllm-router ahead") + one_run


def against_best_peer(
    rows: Sequence[dict[str, Any]], runs: Sequence[dict[str, Any]], default_variant: str
) -> list[str]:
    """Per pool, think time and load: foldgate's default against the vllm-router policy
    best on each figure."""
    out = ["### 4. foldgate's default vs the best vllm-router policy", ""]
    defaults = [r for r in rows if is_default(r, default_variant)]
    measured = False
    for ours in defaults:
        peers = [r for r in _peers_of(rows, ours) if r["arm"] == "vllm_router"]
        if not peers:
            continue
        measured = True
        figures = VERSUS_STEPS if ours["load"] == "steps" else VERSUS_SESSIONS
        who = "step load" if ours["load"] == "steps" else f"{ours['users']} sessions"
        out += [
            f"{who}, KV pool {ours['kv_cache_bytes'] / 2**20:.0f} MiB per replica, think time "
            f"`{ours.get('think_time') or '0'}` ({arm_label(ours)}, {ours.get('runs', 1)} "
            "run(s) per cell):",
            "",
            "| figure | foldgate default | best vllm-router | policy | verdict |",
            "|---|---|---|---|---|",
        ]
        for key, heading, pattern, higher in figures:
            measured_peers = [p for p in peers if isinstance(p.get(key), int | float)]
            if not isinstance(ours.get(key), int | float) or not measured_peers:
                continue
            pick = max if higher else min
            best = pick(measured_peers, key=lambda p, key=key: p[key])
            said = verdict(
                _per_run(runs, ours["cell"], key), _per_run(runs, best["cell"], key), higher
            )
            out.append(
                f"| {heading} | {fmt(ours[key], pattern)} | {fmt(best[key], pattern)} | "
                f"{best['router_policy']} | {said} |"
            )
        out.append("")
    if not measured:
        out += ["- not measured in this profile (needs foldgate's default and vllm-router)", ""]
    return out


def capacity_answer(
    stepped: Sequence[dict[str, Any]], runs: Sequence[dict[str, Any]], bound_ms: float
) -> list[str]:
    out = [
        f"### 5. Capacity: most concurrent sessions served with client TTFT p95 under "
        f"{bound_ms:.0f} ms (no failures), per step-load arm",
        "",
        "| cell | arm | sessions served (per run) | longest admission wait s |",
        "|---|---|---|---|",
    ]
    for r in stepped:
        per_run = _per_run(runs, r["cell"], "capacity_users")
        out.append(
            f"| {r['cell']} | {arm_label(r)} | "
            f"{', '.join(f'{v:.0f}' for v in per_run) or '–'} | "
            f"{fmt(r.get('admission_wait_max_s'), '{:.3f}')} |"
        )
    out.append("")
    return out
