"""Session store cost: ingest latency early and late in a long session, and bytes stored.

Requests are what a harness sends before each assistant reply (``requests_of``); step t is
the first request whose history has at least t messages. Each timed sample stores request
t-1 into a fresh session (untimed), then times the ingest of request t, so only its new
suffix (usually an assistant turn and its tool output) is written. ``warm``: the same store
object ingested request t-1, as the sticky replica would have; ``cold``: another store
object (another replica, an empty digest memory) ingests request t. Then every trajectory
is replayed request by request into one session and its stored size is compared with the
trajectory's raw JSON (its line in the normalized JSONL file).

    .venv/bin/python bench/store.py [--norm DIR] [--redis-url URL] [--samples N]

Without --redis-url a throwaway redis-server (no persistence) is started on a free port.
Redis size is MEMORY USAGE of the session's keys; SQLite size is the database file holding
only that session (after a WAL checkpoint) and, in brackets, the history bytes it counts.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.local_servers import RedisServer
from offline.importers import Trajectory, load_trajectories
from offline.replay import requests_of
from store import SessionStore, open_store

DEFAULT_NORM = Path(__file__).resolve().parent.parent / ".." / "shared" / "trajectories" / "norm"
STEPS = (30, 300)

Msg = dict[str, Any]


def requests(traj: Trajectory) -> list[list[Msg]]:
    return [[m.to_dict() for m in r.messages] for r in requests_of(traj.transcript) if r.messages]


def pick(reqs: list[list[Msg]], t: int) -> int:
    return next(i for i, r in enumerate(reqs) if len(r) >= t)


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def time_step(url: str, reqs: list[list[Msg]], t: int, samples: int) -> dict[str, Any]:
    i = pick(reqs, t)
    prev, cur = reqs[i - 1], reqs[i]
    warm_store, cold_store = open_store(url), open_store(url)
    warm: list[float] = []
    cold: list[float] = []
    appended = set()
    try:
        for n in range(samples):
            for store, out in ((warm_store, warm), (cold_store, cold)):
                session = f"bench-{uuid.uuid4().hex}"
                await warm_store.ingest("bench", session, prev)
                started = time.perf_counter()
                result = await store.ingest("bench", session, cur)
                elapsed = time.perf_counter() - started
                if n:  # the first sample loads scripts and opens connections
                    out.append(elapsed)
                appended.add(result.appended)
                await warm_store.delete_session("bench", session)
    finally:
        await warm_store.close()
        await cold_store.close()
    return {
        "t": len(cur),
        "suffix": sorted(appended),
        "warm": (pct(warm, 0.5), pct(warm, 0.99)),
        "cold": (pct(cold, 0.5), pct(cold, 0.99)),
    }


async def replay_size(store: SessionStore, session: str, reqs: list[list[Msg]]) -> int:
    for r in reqs:
        await store.ingest("bench", session, r)
    return await store.stored_bytes("bench", session)  # type: ignore[attr-defined]


async def sqlite_size(reqs: list[list[Msg]], tmp: Path) -> tuple[int, int]:
    path = tmp / f"{uuid.uuid4().hex}.db"
    store = open_store(f"sqlite://{path}")
    counted = await replay_size(store, "s", reqs)
    await store.close()  # closing the last connection checkpoints the WAL into the file
    return path.stat().st_size, counted


def raw_json_size(traj: Trajectory) -> int:
    """Bytes of the run's normalized JSON record (one run per line in ``norm/``)."""
    lines = traj.source_path.read_bytes().splitlines()
    if len(lines) != 1:
        raise SystemExit(f"{traj.source_path}: expected one run per line-file, got {len(lines)}")
    return len(lines[0])


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--norm", type=Path, default=DEFAULT_NORM)
    parser.add_argument("--redis-url")
    parser.add_argument("--samples", type=int, default=200)
    args = parser.parse_args()
    trajectories = load_trajectories(*sorted(args.norm.glob("*.jsonl")))
    if not trajectories:
        raise SystemExit(f"no trajectories under {args.norm}")
    console = Console(width=160)
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        server = None
        url = args.redis_url
        if url is None:
            server = RedisServer(tmp / "redis")
            server.start()
            url = server.url
        try:
            await report(console, trajectories, url, tmp, args.samples)
        finally:
            if server is not None:
                server.stop()


async def report(
    console: Console, trajectories: list[Trajectory], url: str, tmp: Path, samples: int
) -> None:
    longest = max(trajectories, key=lambda t: len(t.transcript.messages))
    reqs = requests(longest)
    table = Table(title=f"ingest of step t, {longest.id} ({samples} samples, ms)")
    for col in ("backend", "t (messages)", "new msgs", "warm p50", "warm p99", "cold p50"):
        table.add_column(col, justify="right")
    table.add_column("cold p99", justify="right")
    ratios = {}
    for backend, backend_url in (("redis", url), ("sqlite", f"sqlite://{tmp / 'steps.db'}")):
        p50 = {}
        for t in STEPS:
            r = await time_step(backend_url, reqs, t, samples)
            p50[t] = r["warm"][0]
            row = [backend, str(r["t"]), ",".join(map(str, r["suffix"]))]
            row += [f"{v * 1000:.3f}" for v in (*r["warm"], *r["cold"])]
            table.add_row(*row)
        ratios[backend] = p50[STEPS[1]] / p50[STEPS[0]]
    console.print(table)
    for backend, ratio in ratios.items():
        console.print(f"{backend}: warm p50 at t={STEPS[1]} / t={STEPS[0]} = {ratio:.2f}x")

    sizes = Table(title="bytes stored per session (whole trajectory replayed request by request)")
    for col in ("trajectory", "messages", "raw JSON", "redis", "", "sqlite file [counted]", " "):
        sizes.add_column(col, justify="right")
    redis_store = open_store(url)
    try:
        for traj in sorted(trajectories, key=raw_json_size, reverse=True):
            reqs = requests(traj)
            raw = raw_json_size(traj)
            session = f"size-{uuid.uuid4().hex}"
            red = await replay_size(redis_store, session, reqs)
            await redis_store.delete_session("bench", session)
            file_size, counted = await sqlite_size(reqs, tmp)
            sizes.add_row(
                traj.id[:48],
                str(len(traj.transcript.messages)),
                f"{raw:,}",
                f"{red:,}",
                f"{red / raw:.0%}",
                f"{file_size:,} [{counted:,}]",
                f"{file_size / raw:.0%}",
            )
    finally:
        await redis_store.close()
    console.print(sizes)


if __name__ == "__main__":
    asyncio.run(main())
