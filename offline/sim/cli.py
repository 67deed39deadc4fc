"""``foldgate simulate``: the cluster simulator's command line."""

from __future__ import annotations

import multiprocessing
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from gateway.config import GatewayConfig
from gateway.fold.refold import FOLD_MODES
from offline.cli_options import (
    chat_tokenizer,
    json_option,
    load_paths,
    tokenizer_option,
    trajectory_options,
)
from offline.replay import ReplayConfig, request_count
from offline.sim.cluster import SimConfig, simulate
from offline.sim.judge import judge
from offline.sim.judge import markdown as judgement_markdown
from offline.sim.report import markdown_table, write_outputs
from offline.sim.result import CellResult
from offline.sim.workload import SHARE_MODES, Workload, build_workload
from router import COST_PRESETS, POLICY_NAMES
from router.cost import CostModel, get_preset

# The workload and the progress queue, inherited by forked workers (not pickled per cell).
_WORKLOAD: Workload | None = None
_PROGRESS: Any = None


def _csv(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


def _run_cell(index: int, config: SimConfig) -> tuple[int, CellResult]:
    assert _WORKLOAD is not None

    def report(t: float) -> None:
        if _PROGRESS is not None:
            _PROGRESS.put((index, t))

    return index, simulate(_WORKLOAD, config, report)


@click.command("simulate")
@trajectory_options
@click.option(
    "--preset",
    type=click.Choice(sorted(COST_PRESETS)),
    default="h200-qwen3.6-27b",
    show_default=True,
    help="Replica cost model and engine shape (KV pool, block size, token budget).",
)
@click.option("--replicas", type=click.IntRange(min=1), default=8, show_default=True)
@click.option(
    "--concurrency",
    default="256",
    show_default=True,
    help="Concurrent sessions, comma-separated for several loads (a finished session is "
    "replaced at once). Ignored with --arrival-rate.",
)
@click.option(
    "--arrival-rate",
    default=None,
    help="Poisson session arrivals per second instead, comma-separated for several loads.",
)
@click.option(
    "--policy",
    "policies",
    default="sticky,sticky_cost,least_loaded,round_robin",
    show_default=True,
    help=f"Routing policies ({', '.join(POLICY_NAMES)}).",
)
@click.option(
    "--strategy",
    "strategies",
    default="base,refold",
    show_default=True,
    help="Renderer specs (base, refold, cliff, mask, clip, refold+cliff).",
)
@click.option("--duration", type=click.FloatRange(min=1), default=900.0, show_default=True)
@click.option(
    "--warmup",
    type=click.FloatRange(min=0),
    default=120.0,
    show_default=True,
    help="Seconds simulated before measuring.",
)
@click.option(
    "--think",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    help="Mean think time (tool execution) between a reply and the next request, seconds.",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--share",
    type=click.Choice(SHARE_MODES),
    default="head",
    show_default=True,
    help="What sessions replaying one recording share in a replica's cache: only the head "
    "(tools and system prompt, as distinct tasks of one agent do) or everything.",
)
@click.option(
    "--budget",
    type=click.IntRange(min=1),
    default=None,
    help="Token budget, as the gateway's `budget` (cliff needs one) [default: none].",
)
@click.option(
    "--fold",
    type=click.Choice(FOLD_MODES),
    default=GatewayConfig.fold,
    show_default=True,
    help="ReFold's fold mode, as the gateway's `fold` setting.",
)
@click.option("--k", type=click.IntRange(min=1), default=3, show_default=True)
@click.option(
    "--jobs",
    type=click.IntRange(min=1),
    default=min(2, os.cpu_count() or 1),
    show_default=True,
    help="Cells simulated in parallel processes.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("sim-out"),
    show_default=True,
    help="Folder for results.csv, results.json, report.md and plots.",
)
def simulate_command(
    paths: tuple[Path, ...],
    preset: str,
    replicas: int,
    concurrency: str,
    arrival_rate: str | None,
    policies: str,
    strategies: str,
    duration: float,
    warmup: float,
    think: float,
    seed: int,
    share: str,
    strict: bool,
    tokenizer: str | None,
    budget: int | None,
    fold: str,
    k: int,
    jobs: int,
    out: Path,
) -> None:
    """Simulate R vLLM replicas serving agent sessions that replay recorded trajectories.

    Every request is rendered by the real strategy code, tokenized with the real tokenizer
    and routed by the real policy; each replica is modelled as vLLM v1 schedules (KV pool
    of blocks, prefix cache with LRU eviction, chunked prefill, preemption by recompute)
    with step times from the --preset cost model. One cell per policy x strategy x load.

    With sticky, sticky_cost and least_loaded among the policies it ends with issue 9's
    judgement: at the knee load (the first where sticky reaches 90% of its best
    throughput over the loads given), sticky_cost's hit rate against sticky's (at most 1
    point below) and its p95 queue against least_loaded's (at most 10% above), with
    round_robin beside them.

    \b
    Example (GPU scale):
      foldgate simulate shared/trajectories/norm --preset h200-qwen3.6-27b \\
          --replicas 8 --concurrency 256 --out sim-out
    """
    global _WORKLOAD, _PROGRESS
    console = Console(stderr=True)
    cost = get_preset(preset)
    policy_names = _csv(policies)
    unknown = sorted(set(policy_names) - set(POLICY_NAMES))
    if unknown or not policy_names:
        raise click.BadParameter(f"unknown policy {unknown}", param_hint="--policy")
    try:
        loads: list[dict[str, Any]] = (
            [{"concurrency": None, "arrival_rate": float(x)} for x in _csv(arrival_rate)]
            if arrival_rate
            else [{"concurrency": int(x), "arrival_rate": None} for x in _csv(concurrency)]
        )
        configs = [
            SimConfig(
                policy=p,
                strategy=s,
                cost=cost,
                replicas=replicas,
                duration_s=duration,
                warmup_s=warmup,
                think_s=think,
                seed=seed,
                **load,
            )
            for load in loads
            for s in _csv(strategies)
            for p in policy_names
        ]
        replay_config = ReplayConfig(
            strategies=_csv(strategies), k=k, budget=budget, block_size=cost.block_size
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    chat = chat_tokenizer(tokenizer)
    trajectories = load_paths(paths, strict=strict, console=console)
    started = time.perf_counter()
    columns = (TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        requests = sum(request_count(t.transcript) for t in trajectories)
        render = progress.add_task("rendering", total=requests * len(replay_config.strategies))
        try:
            _WORKLOAD = build_workload(
                trajectories,
                chat,
                replay_config,
                share=share,
                fold=fold,
                on_request=lambda: progress.advance(render),
            )
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--strategy") from exc
        progress.remove_task(render)
        tasks = [
            progress.add_task(f"{c.policy}/{c.strategy}/{c.load}", total=duration) for c in configs
        ]
        results: list[CellResult | None] = [None] * len(configs)
        if jobs == 1 or len(configs) == 1:
            for i, c in enumerate(configs):
                results[i] = simulate(
                    _WORKLOAD, c, lambda t, i=i: progress.update(tasks[i], completed=t)
                )
        else:
            ctx = multiprocessing.get_context("fork")
            _PROGRESS = ctx.Queue()
            with ctx.Pool(jobs) as workers:
                pending = [workers.apply_async(_run_cell, (i, c)) for i, c in enumerate(configs)]
                while pending:
                    while not _PROGRESS.empty():
                        i, t = _PROGRESS.get()
                        progress.update(tasks[i], completed=t)
                    for job in [j for j in pending if j.ready()]:
                        i, result = job.get()
                        results[i] = result
                        progress.update(tasks[i], completed=duration)
                        pending.remove(job)
                    time.sleep(0.1)
            _PROGRESS = None
    done = [r for r in results if r is not None]
    elapsed = time.perf_counter() - started
    setup = {
        "preset": preset,
        "replicas": replicas,
        "kv pool per replica (tokens)": f"{cost.kv_pool_tokens:,}",
        "block size": cost.block_size,
        "max_num_batched_tokens": cost.max_num_batched_tokens,
        "duration / warm-up (s)": f"{duration:g} / {warmup:g}",
        "think time mean (s)": think,
        "seed": seed,
        "trajectories": len(_WORKLOAD.trajectories),
        "tokenizer": _WORKLOAD.tokenizer,
        "shared in cache": share,
        "ReFold fold mode": fold,
        "wall time (s)": round(elapsed, 1),
    }
    argv = sys.argv[sys.argv.index("simulate") + 1 :] if "simulate" in sys.argv else sys.argv[1:]
    command = "foldgate simulate " + " ".join(shlex.quote(a) for a in argv)
    verdict = judgement_markdown(judge(configs, done)) if len(done) == len(configs) else ""
    write_outputs(done, out, setup, command, verdict)
    click.echo(markdown_table([r.summary() for r in done]))
    if verdict:
        click.echo("\n" + verdict)
    console.print(
        f"{len(done)} cells in {elapsed:.1f}s; wrote {out}/ (report.md, CSV, JSON, plots)"
    )


@click.command("simulate-fit")
@click.option(
    "--replica",
    default=None,
    help="Base URL of a running vLLM replica to probe [default: start one deploy/cpu "
    "replica of the tiny model on a free port, and stop it after; run under "
    "`flock /tmp/foldgate-vllm.lock` on shared machines].",
)
@click.option("--model", default="tiny", show_default=True, help="Served model name.")
@click.option(
    "--base",
    type=click.Choice(sorted(COST_PRESETS)),
    default="cpu-tiny",
    show_default=True,
    help="Preset whose engine shape (KV pool, block size, budget) the fit keeps.",
)
@click.option(
    "--prompt-sizes", default="128,512,2048,6000", show_default=True, help="Cold prompt sizes."
)
@click.option("--output-tokens", type=click.IntRange(min=3), default=24, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--experiment",
    "experiments",
    multiple=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Fit the serving-path terms (per streamed token, per request) instead, from this "
    "Locust experiment's request logs (its fixed-work gateway cells), on top of --base's "
    "engine terms. Repeat for several runs.",
)
@json_option("Write the fitted coefficients (and the probes' phases) as JSON.")
def fit_command(
    replica: str | None,
    model: str,
    base: str,
    prompt_sizes: str,
    output_tokens: int,
    seed: int,
    experiments: tuple[Path, ...],
    json_path: Path | None,
) -> None:
    """Fit a cost model's coefficients from probes of a live vLLM replica, or its
    serving-path terms from a Locust experiment.

    Probes: cold prompts of random token ids, alone and four at a time, are streamed; each
    prefill (time to first token) and decode stretch is a known number of engine steps,
    so a non-negative least-squares fit gives seconds per step, per prefill token, per
    decoding sequence and per attended token. Prints them as a preset to paste into
    router/cost.py, with the fit's error per probe.

    --experiment: what the requests the Locust users logged took beyond the engine terms'
    prediction (the API server's and the gateway's work per streamed token, sharing the
    replicas' cores, and per request), as per_output_token_s and per_request_s; how
    widely their decode stretches spread around the fitted model, as step_jitter; and the
    time between streamed tokens against how many requests decoded beside each one, on
    its replica and on the others (where the serving path's per-token work lands).
    """
    import asyncio
    import json

    if experiments:
        _fit_serving_path(experiments, get_preset(base), json_path)
        return

    from deploy.cpu.replicas import available_cores, free_ports, start_replicas
    from offline.sim.calibrate import fit_coefficients, fitted, measure_phases

    preset = get_preset(base)
    sizes = [int(x) for x in _csv(prompt_sizes)]

    def probe(url: str) -> list[Any]:
        return asyncio.run(
            measure_phases(
                url,
                model,
                preset.max_num_batched_tokens,
                prompt_sizes=sizes,
                output_tokens=output_tokens,
                seed=seed,
            )
        )

    if replica is not None:
        phases = probe(replica.rstrip("/"))
    else:
        with start_replicas(
            1,
            ports=free_ports(1),
            cores=available_cores()[:1],
            block_size=preset.block_size,
            kv_cache_bytes=preset.kv_pool_tokens * preset.kv_bytes_per_token,
        ) as started:
            phases = probe(started.urls[0])
    coefficients = fit_coefficients(phases)
    model_fit = fitted(preset, coefficients)
    click.echo("phase (steps, prefill tok, decode seq-steps, attended tok): measured -> fitted")
    for p in phases:
        predicted = sum(c * f for c, f in zip(coefficients, p.features, strict=True))
        click.echo(
            f"  {p.steps:>5.0f} {p.prefill_tokens:>7.0f} {p.decode_seqs:>5.0f} "
            f"{p.attended_tokens:>10.0f}: {p.seconds:.4f}s -> {predicted:.4f}s"
        )
    click.echo(
        f"per_step_s={model_fit.per_step_s:.3g}, "
        f"per_prefill_token_s={model_fit.per_prefill_token_s:.3g}, "
        f"per_decode_seq_s={model_fit.per_decode_seq_s:.3g}, "
        f"per_attended_token_s={model_fit.per_attended_token_s:.3g},"
    )
    if json_path is not None:
        json_path.write_text(
            json.dumps(
                {
                    "coefficients": dict(
                        zip(
                            (
                                "per_step_s",
                                "per_prefill_token_s",
                                "per_decode_seq_s",
                                "per_attended_token_s",
                            ),
                            coefficients,
                            strict=True,
                        )
                    ),
                    "phases": [[*p.features, p.seconds] for p in phases],
                },
                indent=1,
            )
        )


def _fit_serving_path(
    experiments: tuple[Path, ...], base: CostModel, json_path: Path | None
) -> None:
    import dataclasses
    import json

    from offline.sim.compare import read_experiment
    from offline.sim.serving_path import fit_serving_path, token_interval

    served = [r for folder in experiments for c in read_experiment(folder)[1] for r in c.served()]
    try:
        fit = fit_serving_path(served, base)
    except ValueError as exc:
        raise click.UsageError(f"{', '.join(map(str, experiments))}: {exc}") from exc
    click.echo(
        f"{len(served)} requests; engine terms of {base.name}: per_step_s={base.per_step_s:.3g}, "
        f"per_decode_seq_s={base.per_decode_seq_s:.3g}"
    )
    click.echo(
        f"per_output_token_s={fit.per_output_token_s:.3g}, "
        f"per_request_s={fit.per_request_s:.3g}, step_jitter={fit.step_jitter:.2g},"
    )
    record = dataclasses.asdict(fit)
    try:
        interval = token_interval(served)
    except ValueError:
        interval = None  # too few requests to tell where the per-token work lands
    if interval is not None:
        click.echo(
            f"time between streamed tokens: {1e3 * interval.alone_s:.0f} ms, "
            f"{1e3 * interval.per_same_replica_s:+.0f} ms per other request decoding on its "
            f"replica, {1e3 * interval.per_other_replica_s:+.0f} ms per request decoding on "
            f"another (R² {interval.r2:.2f}, {interval.requests} requests)"
        )
        record["token_interval"] = dataclasses.asdict(interval)
    if json_path is not None:
        json_path.write_text(json.dumps(record, indent=1))


@click.command("simulate-compare")
@click.argument(
    "experiments",
    nargs=-1,
    required=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
)
@click.option(
    "--root",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="Folder the experiment's trajectory paths are relative to (its repository root).",
)
@click.option(
    "--preset",
    type=click.Choice(sorted(COST_PRESETS)),
    default="cpu-tiny",
    show_default=True,
    help="Cost model of the experiment's replicas (the KV pool comes from each cell).",
)
@click.option(
    "--replay",
    type=click.Choice(["policy", "routes", "schedule"]),
    default="policy",
    show_default=True,
    help="policy: the simulator runs each cell's routing policy. routes: each request goes "
    "to the replica the run's requests.jsonl names. schedule: there, and sent when the run "
    "sent it. routes and schedule check the replica model apart from the routing's "
    "timing-dependent choices; under schedule compare hit rates only (the pace is the run's).",
)
@click.option(
    "--seeds",
    type=click.IntRange(min=1),
    default=20,
    show_default=True,
    help="Simulations per cell (seeds 0..N-1), pooled: each draws the replicas' step-time "
    "jitter (the preset's step_jitter) anew. The simulated order of two cells counts only "
    "where it is clear of the seeds' noise (twice the standard error).",
)
@tokenizer_option
def compare_command(
    experiments: tuple[Path, ...],
    root: Path,
    preset: str,
    replay: str,
    seeds: int,
    tokenizer: str | None,
) -> None:
    """Simulate every fixed-work cell of a Locust experiment and print simulated beside
    measured: vLLM's prefix-hit rate, queue time (mean, p95 bucket), session-steps/min,
    TTFT p50, prompt tokens; then whether the cells agree on hit rate (5 points) and rank
    alike by queue time and throughput.

    EXPERIMENTS: folders `python -m loadtests.experiment --out` wrote (profile.json,
    results.csv), one or several runs of the same profile. With several, the measured
    figures are their mean, and two cells count as ordered only where the difference of
    their means exceeds both cells' run-to-run spread (max - min over the runs); a smaller
    difference is a tie, which either simulated order agrees with. The simulation orders
    a pair where the mean over its seeds differs by more than twice the difference's
    standard error.
    """
    from offline.sim.compare import compare, markdown, read_runs

    console = Console(stderr=True)
    settings, cells = read_runs(list(experiments))
    if not cells:
        raise click.UsageError(
            f"{', '.join(map(str, experiments))}: no fixed-work gateway cells with results"
        )
    cost = get_preset(preset)
    if int(settings.get("block_size", cost.block_size)) != cost.block_size:
        raise click.UsageError(
            f"the experiment's block size {settings['block_size']} is not {preset}'s "
            f"{cost.block_size}"
        )
    paths = tuple(root / p for p in settings["trajectories"])
    trajectories = load_paths(paths, strict=False, console=console)
    chat = chat_tokenizer(tokenizer)
    cap = int(settings.get("max_tokens_cap") or 0)
    workloads = {
        strategy: build_workload(
            trajectories,
            chat,
            ReplayConfig(
                strategies=(strategy,),
                block_size=cost.block_size,
                budget=int(settings.get("budget") or 0) or None,
            ),
            max_steps=int(settings.get("max_steps") or 0) or None,
            max_output_tokens=cap or 1 << 30,
        )
        for strategy in sorted({runs[0].strategy for runs in cells})
    }
    try:
        compared = compare(workloads, cells, settings, cost, replay, seeds)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(markdown(compared))
