"""``foldgate simulate-fit`` and ``simulate-compare``: the simulator against the real
thing. Fit a cost model from probes of a live vLLM replica, or the serving path's terms
from a Locust experiment; simulate an experiment's cells beside what it measured."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console

from offline.cli_options import (
    chat_tokenizer,
    comma_list,
    json_option,
    load_paths,
    tokenizer_option,
)
from offline.replay import ReplayConfig
from offline.sim.workload import build_workload
from router import COST_PRESETS
from router.cost import CostModel, get_preset

if TYPE_CHECKING:
    from offline.sim.calibrate import Phase


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

    Probes: cold prompts of random token ids, alone and four at a time, are streamed, each
    probe three times with its fastest run kept (load beside it only adds time); each
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
    if experiments:
        _fit_serving_path(experiments, get_preset(base), json_path)
        return
    from offline.sim.calibrate import fit_coefficients, fitted

    preset = get_preset(base)
    phases = _probe(
        replica, preset, model, [int(x) for x in comma_list(prompt_sizes)], output_tokens, seed
    )
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
        names = ("per_step_s", "per_prefill_token_s", "per_decode_seq_s", "per_attended_token_s")
        record = {
            "coefficients": dict(zip(names, coefficients, strict=True)),
            "phases": [[*p.features, p.seconds] for p in phases],
        }
        json_path.write_text(json.dumps(record, indent=1))


def _probe(
    replica: str | None,
    preset: CostModel,
    model: str,
    sizes: list[int],
    output_tokens: int,
    seed: int,
) -> list[Phase]:
    """The probes' phases, from ``replica`` or from a deploy/cpu replica started for them."""
    from deploy.cpu.replicas import available_cores, free_ports, start_replicas
    from offline.sim.calibrate import measure_phases

    def probe(url: str) -> list[Phase]:
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
        return probe(replica.rstrip("/"))
    with start_replicas(
        1,
        ports=free_ports(1),
        cores=available_cores()[:1],
        block_size=preset.block_size,
        kv_cache_bytes=preset.kv_pool_tokens * preset.kv_bytes_per_token,
    ) as started:
        return probe(started.urls[0])


def _fit_serving_path(
    experiments: tuple[Path, ...], base: CostModel, json_path: Path | None
) -> None:
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
            f"{', '.join(map(str, experiments))}: no fixed-work cells with results"
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
