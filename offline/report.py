"""Presenting a replay: a rich table for people, a PNG with the per-step context curves."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gateway.tokens import ChatTokenizer
from offline.replay import (
    ReplayConfig,
    ReplayResult,
    SessionRun,
    TrajectoryLike,
    build_renderers,
    carries_fold_lines,
)
from offline.replay_explain import explain_request

MAX_SUBPLOTS = 4


def _saved(value: int, base: int) -> str:
    return f"{1 - value / base:.1%}" if base else "-"


COLUMNS = (
    "strategy",
    "requests",
    "prompt tok",
    "prefill tok",
    "hit rate",
    "peak ctx",
    "KV GiB mean/max",
    "rewrites",
    "over budget",
    "compactions",
    "stubs",
    "folded",
    "tok saved",
    "prefill saved",
)


def totals_table(result: ReplayResult) -> Table:
    """Per-strategy totals over all sessions; savings are against ``base`` when it ran.

    "prefill tok" are the prompt tokens the prefix cache did not cover (uncached prefill).
    """
    title = f"{result.trajectory_count} sessions, tokenizer {result.tokenizer}"
    table = Table(title=title, title_justify="left")
    for header in COLUMNS:
        table.add_column(header, justify="left" if header == "strategy" else "right")
    base = result.totals.get("base")
    for t in result.totals.values():
        saved = ["-", "-"]
        if base is not None and t.strategy != "base":
            saved = [
                _saved(t.prompt_tokens, base.prompt_tokens),
                _saved(t.uncached_tokens, base.uncached_tokens),
            ]
        table.add_row(
            t.strategy,
            f"{t.requests:,}",
            f"{t.prompt_tokens:,}",
            f"{t.uncached_tokens:,}",
            f"{t.hit_rate:.1%}",
            f"{t.peak_context:,}",
            f"{t.mean_peak_kv_gib:.2f} / {t.max_peak_kv_gib:.2f}",
            str(t.rewrites),
            str(t.over_budget) if result.config.budget else "-",
            str(t.compactions),
            str(t.stubs),
            str(t.folded_steps),
            *saved,
        )
    return table


def accounting_table(result: ReplayResult) -> Table:
    """Where each strategy's tokens went, summed over every request of every session.

    "added" is what the strategy wrote that the harness did not send (protocol text, step
    labels, notes, its restore tool); "stubs" and "folds" what they removed; "re-prefilled"
    the previous prompt's tokens a rewrite made the replica compute again. Net against
    ``base`` is removed minus added; re-prefill is paid in prefill, not prompt size.
    """
    table = Table(title="where the tokens go (summed over requests)", title_justify="left")
    for header in ("strategy", "added", "removed by stubs", "removed by folds", "re-prefilled"):
        table.add_column(header, justify="left" if header == "strategy" else "right")
    for t in result.totals.values():
        if t.strategy == "base":
            continue
        table.add_row(
            t.strategy,
            f"{t.overhead_tokens:,}",
            f"{t.stub_saved_tokens:,}",
            f"{t.fold_saved_tokens:,}",
            f"{t.reprefill_tokens:,}",
        )
    return table


def operators_table(result: ReplayResult) -> Table:
    """Per harness and strategy: what each operator removed, summed over every request of
    its sessions, and as a share of that harness's ``base`` prompt tokens when base ran.

    ReFold's operators: ``dedup`` (stubs), ``progress`` and ``superseded`` (folds from the
    harness's task list and from calls made again), ``protocol`` (the model's STALE marks);
    the cliff's ``compaction`` (the tokens of what its summary stands for, less the
    summary). In a composition the cliff counts the history it summarised, so ReFold's
    removals inside that part are counted by both.
    """
    table = Table(title="what each operator removed, per harness", title_justify="left")
    rows = result.removed_by_harness()
    operators = sorted({op for _, removed in rows.values() for op in removed})
    for header in ("harness", "strategy", "prompt tok", *operators):
        table.add_column(header, justify="left" if header in ("harness", "strategy") else "right")
    for (harness, strategy), (prompt, removed) in sorted(rows.items()):
        if strategy == "base":
            continue
        base = rows.get((harness, "base"), (0, {}))[0]
        cells = [
            f"{removed.get(op, 0):,}" + (f" ({removed.get(op, 0) / base:.1%})" if base else "")
            for op in operators
        ]
        table.add_row(harness, strategy, f"{prompt:,}", *cells)
    return table


def print_report(result: ReplayResult, console: Console) -> None:
    if result.tokenizer_is_estimate:
        console.print("[yellow]token counts are a bytes/4 estimate, not a real tokenizer[/]")
    console.print(result.operators_note())
    console.print(totals_table(result))
    if any(t.strategy != "base" for t in result.totals.values()):
        console.print(accounting_table(result))
        console.print(operators_table(result))
    if result.totals.get("base") is None:
        console.print("(add 'base' to --strategy for the savings column)")


def print_explanations(
    trajectories: list[TrajectoryLike],
    config: ReplayConfig,
    chat: ChatTokenizer,
    n: int,
    console: Console,
) -> None:
    """``--explain N``: per session and strategy, what request ``n`` did not send as is."""
    for trajectory in trajectories:
        fold = config.fold
        if fold == "recorded":
            fold = "on" if carries_fold_lines(trajectory.transcript) else "off"
        for strategy, renderer in build_renderers(config, chat, fold=fold).items():
            if strategy == "base":
                continue
            changes = explain_request(trajectory, renderer, n, chat)
            title = f"{trajectory.id}, request {n}, {strategy}"
            if changes is None:
                console.print(f"{escape(title)}: the session has fewer requests")
                continue
            table = Table(title=title, title_justify="left")
            for header in ("message", "role", "what", "tokens", "why"):
                table.add_column(header, justify="right" if header == "tokens" else "left")
            for change in changes:
                table.add_row(
                    "-" if change.position is None else str(change.position),
                    change.role,
                    change.kind,
                    f"{change.tokens_before:,} -> {change.tokens_after:,}",
                    escape("\n".join(change.why)),
                )
            saved = sum(c.tokens_before - c.tokens_after for c in changes)
            table.caption = f"{len(changes)} messages changed, {saved:,} tokens fewer"
            console.print(table)


def _longest_sessions(result: ReplayResult) -> list[str]:
    length: dict[str, int] = {}
    for r in result.runs:
        length[r.trajectory] = max(length.get(r.trajectory, 0), len(r.context))
    return sorted(length, key=lambda tid: -length[tid])[:MAX_SUBPLOTS]


def write_plot(result: ReplayResult, path: str | Path) -> None:
    """Per-step prompt size per strategy for the longest sessions, and a tokens bar chart."""
    # A bare Figure renders to files without pyplot's global state or a display.
    from matplotlib.figure import Figure

    shown = _longest_sessions(result)
    fig = Figure(figsize=(10, 3.2 * (len(shown) + 1)))
    axes = fig.subplots(len(shown) + 1, 1, squeeze=False)[:, 0]
    by_key: dict[tuple[str, str], SessionRun] = {(r.trajectory, r.strategy): r for r in result.runs}
    for ax, tid in zip(axes[:-1], shown, strict=True):
        for strategy in result.config.strategies:
            run = by_key[(tid, strategy)]
            ax.plot(range(len(run.context)), run.context, label=strategy, linewidth=1.2)
        if result.config.budget:
            ax.axhline(result.config.budget, color="grey", linestyle=":", label="budget")
        ax.set_title(tid, fontsize=9)
        ax.set_xlabel("request")
        ax.set_ylabel("prompt tokens")
        ax.legend(fontsize=7)
    bars = axes[-1]
    names = list(result.totals)
    xs = range(len(names))
    bars.bar(
        [x - 0.2 for x in xs],
        [result.totals[n].prompt_tokens for n in names],
        0.4,
        label="prompt tokens",
    )
    bars.bar(
        [x + 0.2 for x in xs],
        [result.totals[n].uncached_tokens for n in names],
        0.4,
        label="uncached prefill",
    )
    bars.set_xticks(list(xs), names)
    bars.set_title(f"tokens per strategy, all sessions ({result.tokenizer})", fontsize=9)
    bars.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
