"""``foldgate replay``: recorded agent sessions through context strategies, offline."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from offline.cli_options import chat_tokenizer, json_option, load_paths, trajectory_options
from offline.replay import (
    FOLD_MODES,
    MODEL_KV_BYTES_PER_TOKEN,
    ReplayConfig,
    build_renderers,
    replay,
    request_count,
)
from offline.report import print_explanations, print_report, write_plot

ALL_STRATEGIES = "base,refold,cliff,mask,clip"
DEFAULT_BUDGET = 32_000


def _strategies(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[str, ...]:
    names = tuple(s.strip() for s in value.split(",") if s.strip())
    if not names:
        raise click.BadParameter("give at least one strategy, e.g. base,refold")
    return names


@click.command("replay")
@trajectory_options
@click.option(
    "--strategy",
    "strategies",
    default=ALL_STRATEGIES,
    show_default=True,
    callback=_strategies,
    help="Comma-separated renderer specs (base, refold, cliff, mask, clip, refold+cliff).",
)
@click.option(
    "--budget",
    type=click.IntRange(min=1),
    default=DEFAULT_BUDGET,
    show_default=True,
    help="Token budget: cliff's compaction threshold; requests above it are counted.",
)
@click.option(
    "--k",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="ReFold chunk size (the prefix is rewritten once every k steps).",
)
@click.option(
    "--block-size",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    help="Prefix-cache block size in tokens.",
)
@click.option(
    "--cache-blocks",
    type=click.IntRange(min=1),
    default=None,
    help="Prefix-cache capacity per session in blocks (LRU) [default: unlimited].",
)
@click.option(
    "--kv-bytes-per-token",
    type=click.IntRange(min=1),
    default=None,
    help="KV cache bytes per token, for the KV GiB column (overrides --model).",
)
@click.option(
    "--model",
    type=click.Choice(sorted(MODEL_KV_BYTES_PER_TOKEN)),
    default="qwen3.6-27b",
    show_default=True,
    help="Preset for --kv-bytes-per-token (qwen3.6-27b: 65,536 B/token, only its 16 "
    "full-attention layers keep a KV cache).",
)
@click.option(
    "--fold",
    type=click.Choice(FOLD_MODES),
    default="recorded",
    show_default=True,
    help="ReFold's fold mode: recorded = on only for sessions whose replies carry "
    "PROGRESS/STALE lines, else off (a recorded reply cannot answer an ask); auto = the "
    "gateway's default (ask; an ignored ask leaves, two ignored asks stop asking); on = "
    "the paper's setting (protocol in the system prompt, labels, reminders); off = no protocol "
    "(dedup and the harness folds only).",
)
@click.option(
    "--explain",
    "explain",
    type=click.IntRange(min=0),
    default=None,
    metavar="N",
    help="Also show, for request N (0-based) of each session, what each strategy stubbed, "
    "folded or summarised, its tokens before and after, and the line saying why.",
)
@json_option("Write totals and per-request series as JSON.")
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write a PNG: per-request context size and tokens per strategy.",
)
def replay_command(
    paths: tuple[Path, ...],
    strategies: tuple[str, ...],
    tokenizer: str | None,
    budget: int,
    k: int,
    block_size: int,
    cache_blocks: int | None,
    kv_bytes_per_token: int | None,
    model: str,
    fold: str,
    strict: bool,
    explain: int | None,
    json_path: Path | None,
    plot_path: Path | None,
) -> None:
    """Replay recorded agent sessions through context strategies, offline.

    PATHS are trajectory files or folders in any supported format (normalized JSONL,
    Claude Code, mini-swe-agent, SWE-agent, OpenHands). Each session is replayed as its
    harness sent it; every request is rendered by each strategy, tokenized, and run through
    a vLLM-style prefix-cache simulator (one per session and strategy). Prints per-strategy
    totals: prompt tokens, uncached prefill, cache hit rate, peak context and KV memory,
    prefix rewrites, steps over budget, compactions, stubs, folded steps.

    \b
    Examples:
      foldgate replay examples/inventory-reserve-fix.jsonl --budget 2000
      foldgate replay traces/ --strategy base,refold --json out.json --plot out.png
    """
    console = Console(stderr=True)
    chat = chat_tokenizer(tokenizer)
    console.print(f"tokenizer: {chat.counter.name}" + (" (default)" if tokenizer is None else ""))
    try:
        config = ReplayConfig(
            strategies=strategies,
            k=k,
            budget=budget,
            block_size=block_size,
            cache_blocks=cache_blocks,
            kv_bytes_per_token=kv_bytes_per_token or MODEL_KV_BYTES_PER_TOKEN[model],
            fold=fold,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    try:  # check the specs before loading any file
        build_renderers(config, chat)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--strategy") from exc
    trajectories = load_paths(paths, strict=strict, console=console)
    total = sum(request_count(t.transcript) for t in trajectories) * len(strategies)
    started = time.perf_counter()
    columns = (TextColumn("replaying"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("replay", total=total)
        result = replay(trajectories, chat, config, on_request=lambda: progress.advance(task))
    elapsed = time.perf_counter() - started
    # A pipe gets a wide table rather than one squeezed into 80 columns.
    print_report(result, Console() if sys.stdout.isatty() else Console(width=170))
    console.print(
        f"{total:,} renders in {elapsed:.1f}s; {chat.distinct_texts:,} distinct texts tokenized"
    )
    if explain is not None:
        out = Console() if sys.stdout.isatty() else Console(width=170)
        print_explanations(trajectories, config, chat, explain, out)
    if json_path is not None:
        json_path.write_text(json.dumps(result.to_json(), indent=1))
        console.print(f"wrote {json_path}")
    if plot_path is not None:
        write_plot(result, plot_path)
        console.print(f"wrote {plot_path}")
