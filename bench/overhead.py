"""Gateway overhead: added latency vs calling the upstream directly, and requests/s per core.

The upstream is the FAKE instant one (``loadtests/fake_upstream.py``) in its own process, so
every millisecond measured is the gateway's (plus one extra local HTTP hop). The gateway
runs as ``foldgate serve`` in a subprocess, on uvicorn and on Ray Serve (HAProxy ingress,
throughput-optimized). The workload is one synthetic coding-agent session with tool calls
whose history grows step by step to about ``--kb`` KB of text (~``kb*256`` tokens at 4 bytes
per token); request t re-sends the whole history up to step t, as a harness does.

Latency: for every step the same request bytes go directly to the fake upstream and through
the gateway, interleaved, so machine noise hits both alike; the added latency of one step is
gateway minus direct (full SSE response read). "small" pools the first ``--bucket`` steps,
"full" the last ``--bucket`` steps, over ``--repeats`` sessions.

Throughput: ``--sessions`` concurrent sessions each run all steps through the gateway;
req/s per core divides the requests by the CPU seconds (user+system, from /proc) that the
gateway's process tree spent (for Ray: driver, GCS, raylet, controller, replica, HAProxy).

Before and after (``--baseline DIR``, uvicorn): DIR is another source tree (``git worktree
add /tmp/before COMMIT``); its gateway runs beside this tree's against the same fake upstream
and store kind, and each step goes direct, through this gateway and through the baseline's
in rotating order. Runs one after the other disagree by more than most changes (this
machine's speed drifts by 2x within an hour); within one loop the drift hits all three
alike.

``--relay`` adds ``bench/relay.py`` to the same loop: a plain relay (parse, re-send,
stream back) with none of the gateway's logic, the floor any Python gateway on this stack
stands on. ``--peers`` adds what an operator would run instead of foldgate
(``bench/peer_fronts.py``): vLLM's own router (``vllm-router``, the ``peers`` extra,
``--router-policy``) and a LiteLLM proxy (its own venv: ``scripts/litellm-venv.sh``;
``--no-litellm`` leaves it out).

The curve (``--curve``, implies ``--relay --peers``): added latency p50/p99 and requests per
CPU-second of every front over history size (``--curve-tokens``, default about 8k, 36k, 100k
and 200k tokens) at 1, 16 and 64 concurrent sessions (``--curve-sessions``), all fronts in
one interleaved loop per point; a table, and a plot (``--plot``, default
docs/overhead-peers.png). Each point runs rounds of new sessions: every session is opened
(one untimed request to every front, all answered first), then the sessions run at once,
each timing its last ``--curve-per-session`` requests, until ``--curve-samples`` requests
per front are timed; so the figures are those of sessions in mid-run, not of sessions
opening. With ``--baseline`` the other tree's gateway is one more front of the loop
(``--baseline-label`` names it).

Stages (``--stages``): where the gateway's CPU time goes per request, in this process, at the
small and full history sizes: the pipeline's own steps called one by one on an SQLite store
(median of ``--bucket`` steps, milliseconds). HTTP framing, the event loop and garbage
collection are not in it; the latency columns include them.

    .venv/bin/python bench/overhead.py [--modes uvicorn,ray] [--strategies refold,base]
        [--steps 64] [--kb 128] [--repeats 3] [--sessions 16] [--stages] [--json]
        [--baseline DIR] [--relay] [--peers [--router-policy P] [--no-litellm]]
    .venv/bin/python bench/overhead.py --curve [--curve-tokens 8000,36000,100000,200000]
        [--curve-sessions 1,16,64] [--curve-samples 64] [--curve-per-session 4]
        [--baseline DIR --baseline-label NAME] [--plot docs/overhead-peers.png]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext
from pathlib import Path
from statistics import median, quantiles
from typing import Any

import aiohttp
from rich.console import Console
from rich.table import Table

# Run as a script: put the repo first, before bench/ (whose store.py shadows the package).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import (
    ROOT,
    gateway_argv,
    gateway_env,
    post,
    process,
    wait_ready,
)
from bench.peer_fronts import curve, front_headers, plot_curve, start_peers, wait_peers
from bench.stages import print_stages, stage_times
from bench.workload import request_bodies, synthetic_session
from deploy.cpu.replicas import free_ports
from loadtests.cell_processes import tree_cpu_s

# Issue 10's aims for the added latency at a ~32k-token history (p50, "full" column).
AIM_MS = {"uvicorn": 1.0, "ray": 1.5}
THIS_TREE, RELAY = "this tree", "plain relay"


# -- processes ---------------------------------------------------------------------------


# -- measurements -------------------------------------------------------------------------


def p99(samples: list[float]) -> float:
    return quantiles(samples, n=100, method="inclusive")[98]


async def added_latency(
    gateways: Mapping[str, str],
    upstream: str,
    bodies: list[bytes],
    strategy: str,
    repeats: int,
    bucket: int,
) -> dict[str, dict[str, Any]]:
    """Added latency of each gateway (name -> base URL), per step against the same direct
    call; the order of the calls rotates from step to step so that warm-up and the
    machine's drift favour none of them."""
    small: dict[str, list[float]] = {name: [] for name in gateways}
    full: dict[str, list[float]] = {name: [] for name in gateways}
    direct_full: list[float] = []
    json_type = {"content-type": "application/json"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        for _ in range(repeats):
            calls = [("direct", f"{upstream}/v1/chat/completions", json_type)]
            for name, url in gateways.items():
                headers = {
                    **json_type,
                    "x-session-id": f"lat-{uuid.uuid4()}",
                    "x-foldgate-strategy": strategy,
                    **front_headers(name),
                }
                calls.append((name, f"{url}/v1/chat/completions", headers))
            for t, body in enumerate(bodies):
                turn = t % len(calls)
                took = {
                    name: await post(http, url, body, headers)
                    for name, url, headers in calls[turn:] + calls[:turn]
                }
                in_full = t >= len(bodies) - bucket
                for name in gateways:
                    if t < bucket:
                        small[name].append(took[name] - took["direct"])
                    if in_full:
                        full[name].append(took[name] - took["direct"])
                if in_full:
                    direct_full.append(took["direct"])
    ms = 1000.0
    return {
        name: {
            "added_ms_small_p50": median(small[name]) * ms,
            "added_ms_small_p99": p99(small[name]) * ms,
            "added_ms_full_p50": median(full[name]) * ms,
            "added_ms_full_p99": p99(full[name]) * ms,
            "direct_ms_full_p50": median(direct_full) * ms,
            "samples_per_bucket": len(small[name]),
        }
        for name in gateways
    }


async def throughput(
    gateway: str,
    gateway_pid: int,
    bodies: list[bytes],
    strategy: str,
    sessions: int,
    extra_headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    async def one_session(http: aiohttp.ClientSession) -> None:
        headers = {
            "content-type": "application/json",
            "x-session-id": f"tput-{uuid.uuid4()}",
            "x-foldgate-strategy": strategy,
            **(extra_headers or {}),
        }
        for body in bodies:
            await post(http, f"{gateway}/v1/chat/completions", body, headers)

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=600)
    ) as http:
        cpu_before = tree_cpu_s(gateway_pid)
        started = time.perf_counter()
        await asyncio.gather(*(one_session(http) for _ in range(sessions)))
        wall = time.perf_counter() - started
        cpu = tree_cpu_s(gateway_pid) - cpu_before
    requests = sessions * len(bodies)
    return {
        "requests": requests,
        "req_per_s": requests / wall,
        "gateway_cpu_s": cpu,
        "req_per_cpu_s": requests / cpu if cpu > 0 else float("nan"),
    }


async def run_mode(
    mode: str, strategies: Sequence[str], bodies: list[bytes], args: argparse.Namespace, tmp: Path
) -> list[dict[str, Any]]:
    fake_port, gateway_port, baseline_port, relay_port = free_ports(4)
    upstream = f"http://127.0.0.1:{fake_port}"
    trees: dict[str, tuple[int, Path | None]] = {THIS_TREE: (gateway_port, None)}
    if args.baseline:
        trees[args.baseline_label] = (baseline_port, args.baseline)
    fake_log = tmp / "fake.log"
    rows = []
    fake_argv = [sys.executable, "-m", "loadtests.fake_upstream", str(fake_port)]
    with ExitStack() as running:
        fake = running.enter_context(process(fake_argv, fake_log))
        procs: dict[str, tuple[int, subprocess.Popen, Path]] = {}
        for name, (port, source) in trees.items():
            store_url = args.store_url or f"sqlite:///{tmp}/{mode}-{name}-store.db"
            env = gateway_env(mode, tmp)
            if source is not None:
                # The baseline's own code: its tree first on the path, before this editable
                # install.
                env["PYTHONPATH"] = str(source)
            log = tmp / f"{mode}-{name}.log"
            argv = gateway_argv(mode, port, [upstream], store_url)
            procs[name] = (port, running.enter_context(process(argv, log, env)), log)
        if args.relay:
            argv = [sys.executable, str(ROOT / "bench" / "relay.py"), "--port", str(relay_port)]
            log = tmp / f"{mode}-relay.log"
            relay = process([*argv, "--upstream", upstream], log)
            procs[RELAY] = (relay_port, running.enter_context(relay), log)
        peers = (
            start_peers(running, upstream, tmp, args.router_policy, args.litellm)
            if (args.peers)
            else {}
        )
        await wait_ready(f"{upstream}/health", fake, fake_log)
        gateways = {name: f"http://127.0.0.1:{port}" for name, (port, _, _) in procs.items()}
        for name, (_, proc, log) in procs.items():
            await wait_ready(f"{gateways[name]}/health", proc, log)
        await wait_peers(peers)
        gateways |= {name: url for name, (url, _, _, _) in peers.items()}
        pids = {name: proc.pid for name, (_, proc, _) in procs.items()}
        pids |= {name: proc.pid for name, (_, proc, _, _) in peers.items()}
        if args.curve:
            sizes = [int(t) for t in args.curve_tokens.split(",") if t]
            sessions = [int(c) for c in args.curve_sessions.split(",") if c]
            return await curve(
                gateways, pids, upstream, sizes, sessions, args.steps, args.curve_samples,
                args.curve_per_session,
            )  # fmt: skip
        # Warm-up: first-request costs (imports, connection setup, model discovery).
        await added_latency(gateways, upstream, bodies[:4], strategies[0], 1, 2)
        for strategy in strategies:
            latency = await added_latency(
                gateways, upstream, bodies, strategy, args.repeats, args.bucket
            )
            for name, url in gateways.items():
                strategyless = name not in trees
                if strategyless and strategy != strategies[0]:
                    continue  # the relay and the peers have no strategies: one row
                row = {"mode": mode, "tree": name, "strategy": strategy, **latency[name]}
                if strategyless:
                    row["strategy"] = "-"
                if args.sessions:
                    row |= await throughput(
                        url, pids[name], bodies, strategy, args.sessions, front_headers(name)
                    )
                rows.append(row)
    return rows


def print_table(rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    table = Table(
        title=(
            f"gateway overhead vs direct (FAKE upstream): {meta['steps']} steps, "
            f"history {meta['small_kb']:.0f}-{meta['full_kb']:.0f} KB "
            f"(~{meta['full_kb'] * 256:.0f} tokens at the end), {meta['cores']} cores"
        )
    )
    trees = len({r["tree"] for r in rows}) > 1
    for name in (
        "mode",
        *(["gateway"] if trees else []),
        "strategy",
        "added ms small p50/p99",
        "added ms full p50/p99",
        "direct ms full p50",
        "aim ms p50",
        f"req/s {meta['sessions']} sess.",
        "req/CPU-s",
    ):
        left = name in {"mode", "gateway", "strategy"}
        table.add_column(name, justify="left" if left else "right")
    for r in rows:
        table.add_row(
            r["mode"],
            *([r["tree"]] if trees else []),
            r["strategy"],
            f"{r['added_ms_small_p50']:.2f} / {r['added_ms_small_p99']:.2f}",
            f"{r['added_ms_full_p50']:.2f} / {r['added_ms_full_p99']:.2f}",
            f"{r['direct_ms_full_p50']:.2f}",
            f"{AIM_MS[r['mode']]:.1f}",
            f"{r['req_per_s']:.0f}" if "req_per_s" in r else "-",
            f"{r['req_per_cpu_s']:.0f}" if "req_per_cpu_s" in r else "-",
        )
    Console(width=160).print(table)


def report_curve(points: list[dict[str, Any]], meta: dict[str, Any], args: Any) -> int:
    points = [{**r, "front": "foldgate" if r["front"] == THIS_TREE else r["front"]} for r in points]
    title = (
        f"added latency vs direct (FAKE instant upstream), requests per CPU-second; "
        f"{meta['cores']} cores, foldgate as configured by default (refold, sticky)"
    )
    if args.json:
        print(json.dumps({"meta": meta, "curve": points}, indent=2))
    else:
        table = Table(title=title)
        for name in ("front", "history tok", "body KB", "sessions", "added ms p50 / p99",
                     "req/CPU-s", "CPU-s", "rounds", "samples", "failed"):  # fmt: skip
            table.add_column(name, justify="left" if name == "front" else "right")
        for r in points:
            table.add_row(
                r["front"], f"{r['history_tokens']:,}", f"{r['body_kb']:.0f}", str(r["sessions"]),
                f"{r['added_ms_p50']:.2f} / {r['added_ms_p99']:.2f}",
                f"{r['req_per_cpu_s']:.0f}", f"{r['cpu_s']:.2f}", str(r["rounds"]),
                str(r["samples"]), str(r["failed"]),
            )  # fmt: skip
        for r in points:
            if r["failed"]:
                print(f"{r['front']} at {r['history_tokens']:,} tokens, {r['sessions']} "
                      f"sessions: {r['failed']} failed, first: {r['first_failure']}")  # fmt: skip
        Console(width=160).print(table)
    plot_curve(points, args.plot, title)
    print(f"plot: {args.plot}", file=sys.stderr)
    return 0


def work_folder(keep: Path | None) -> AbstractContextManager[str]:
    """The folder for the processes' logs and stores: ``keep`` (created, left in place) or a
    temporary one removed at the end."""
    if keep is None:
        return tempfile.TemporaryDirectory(prefix="fgo-")
    keep.mkdir(parents=True, exist_ok=True)
    return nullcontext(str(keep.resolve()))


async def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default="uvicorn,ray", help="comma list of uvicorn, ray")
    parser.add_argument("--strategies", default="refold,base", help="comma list of strategies")
    parser.add_argument("--steps", type=int, default=64, help="tool steps in the session")
    parser.add_argument("--kb", type=int, default=128, help="history size at the last step")
    parser.add_argument("--repeats", type=int, default=3, help="latency sessions per strategy")
    parser.add_argument("--bucket", type=int, default=8, help="steps in the small/full buckets")
    parser.add_argument("--sessions", type=int, default=16, help="concurrent sessions (0: skip)")
    parser.add_argument("--stages", action="store_true", help="also time each pipeline step")
    parser.add_argument("--store-url", help="gateway store (default: a fresh SQLite file)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another source tree (git worktree add DIR COMMIT) whose gateway runs beside "
        "this one, the calls interleaved (uvicorn only)",
    )
    parser.add_argument(
        "--baseline-label", default="baseline", help="the baseline's name in the tables"
    )
    parser.add_argument(
        "--relay",
        action="store_true",
        help="also time bench/relay.py, a plain relay with no gateway logic (the floor), "
        "interleaved the same way (uvicorn only)",
    )
    parser.add_argument(
        "--peers",
        action="store_true",
        help="also time vllm-router and a LiteLLM proxy in the same loop (uvicorn only)",
    )
    parser.add_argument(
        "--router-policy", default="cache_aware", help="vllm-router's --policy (its default)"
    )
    parser.add_argument(
        "--no-litellm", dest="litellm", action="store_false", help="--peers without LiteLLM"
    )
    parser.add_argument(
        "--curve",
        action="store_true",
        help="the curve over history size and concurrency (implies --relay --peers)",
    )
    parser.add_argument("--curve-tokens", default="8000,36000,100000,200000")
    parser.add_argument("--curve-sessions", default="1,16,64")
    parser.add_argument(
        "--curve-samples", type=int, default=64, help="timed requests per front per point"
    )
    parser.add_argument(
        "--curve-per-session",
        type=int,
        default=4,
        help="timed requests per session (its last ones; the history within this many "
        "steps of the point's size)",
    )
    parser.add_argument(
        "--keep-logs",
        type=Path,
        help="write the processes' logs and stores to this folder and keep them (default: a "
        "temporary folder, removed at the end): the gateway's log says why it answered an error",
    )
    parser.add_argument(
        "--plot", type=Path, default=ROOT / "docs" / "overhead-peers.png", help="--curve's PNG"
    )
    args = parser.parse_args(argv)
    if args.curve:
        args.relay = args.peers = True
        args.modes, args.strategies, args.sessions = "uvicorn", args.strategies.split(",")[0], 0
    modes = [m for m in args.modes.split(",") if m]
    bad = sorted(set(modes) - set(AIM_MS))
    if bad:
        parser.error(f"unknown mode(s) {', '.join(bad)}; choose from uvicorn, ray")
    if args.steps < 4 or not 1 <= args.bucket <= args.steps:
        parser.error("need --steps >= 4 and 1 <= --bucket <= --steps")
    if args.curve and not 1 <= args.curve_per_session < args.steps:
        parser.error("need 1 <= --curve-per-session < --steps")
    if args.repeats * args.bucket < 2:
        parser.error("need --repeats x --bucket >= 2 samples for a percentile")
    if (args.baseline is not None or args.relay or args.peers) and modes != ["uvicorn"]:
        parser.error("--baseline, --relay and --peers run with --modes uvicorn only")
    if args.baseline is not None:
        if not (args.baseline / "gateway" / "cli.py").is_file():
            parser.error(f"--baseline {args.baseline}: not a foldgate source tree")
        args.baseline = args.baseline.resolve()
    strategies = [s for s in args.strategies.split(",") if s]
    messages = synthetic_session(args.steps, args.kb)
    bodies = request_bodies(messages, args.steps)
    meta = {
        "steps": args.steps,
        "small_kb": len(bodies[args.bucket - 1]) / 1024,
        "full_kb": len(bodies[-1]) / 1024,
        "repeats": args.repeats,
        "sessions": args.sessions,
        "cores": os.cpu_count(),
    }
    rows: list[dict[str, Any]] = []
    stages: dict[str, dict[str, dict[str, float]]] = {}
    if args.curve:
        with work_folder(args.keep_logs) as tmp:
            points = await run_mode("uvicorn", strategies, bodies, args, Path(tmp))
        return report_curve(points, meta, args)
    with work_folder(args.keep_logs) as tmp:
        for mode in modes:
            rows += await run_mode(mode, strategies, bodies, args, Path(tmp))
        if args.stages:
            for strategy in strategies:
                stages[strategy] = await stage_times(bodies, strategy, args.bucket, Path(tmp))
    if args.json:
        print(json.dumps({"meta": meta, "rows": rows, "stages": stages}, indent=2))
        return 0
    if rows:
        print_table(rows, meta)
    if stages:
        print_stages(stages)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
