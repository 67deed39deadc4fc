"""Where a full request's CPU goes in a running gateway: ``foldgate serve`` over the FAKE
upstream, ``bench/workload.py``'s sessions through it, py-spy sampling the gateway
meanwhile; printed: the CPU per request of the event loop's thread and of the others (the
SQLite worker, the bulk worker: what the samples' shares do not show), and each step's
inclusive share of the event loop thread's samples.

    .venv/bin/python bench/profile.py [--kb 128] [--sessions 16] [--raw OUT.txt]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from collections import Counter
from functools import partial
from pathlib import Path

import aiohttp

# Run as a script: put the repo first, before bench/ (whose store.py shadows the package).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import gateway_argv, process, replay_session, thread_cpu_seconds, wait_ready
from bench.workload import request_bodies, synthetic_session
from deploy.cpu.replicas import free_ports

PY_SPY = Path(sys.executable).parent / "py-spy"
# The steps of a request, by the function that runs each (inclusive share).
STEPS = {
    "body read + parse": "Decoder.read",
    "decode": "Pipeline.decode",
    "store read (digest cache + lookup)": "Pipeline.ingest",
    "digest cache (both calls)": "DigestCache.prepare",
    "store write": "Pipeline.store_history",
    "render": "Pipeline.rendered",
    "upstream body": "Forward.body",
    "upstream request, first chunk": "UpstreamClient.open_chat_stream",
    "reply streamed back": "EventStream.__call__",
    "accounting": "account",
}


def shares(raw: Path) -> dict[str, float]:
    """Each step's share of the samples of the event loop's thread (``Runner.run``)."""
    counts: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        names = {frame.split(" (")[0] for frame in stack.split(";")}
        if "Runner.run" not in names:
            continue
        total += int(n)
        for step, function in STEPS.items():
            if function in names:
                counts[step] += int(n)
    return {step: 100.0 * counts[step] / max(total, 1) for step in STEPS}


async def run(kb: int, sessions: int, raw: Path) -> None:
    steps = 64
    bodies = request_bodies(synthetic_session(steps, kb), steps)
    fake_port, port = free_ports(2)
    upstream = f"http://127.0.0.1:{fake_port}"
    with tempfile.TemporaryDirectory(prefix="fgp-") as folder:
        tmp = Path(folder)
        fake_argv = [sys.executable, "-m", "loadtests.fake_upstream", str(fake_port)]
        argv = gateway_argv("uvicorn", port, [upstream], f"sqlite:///{tmp}/store.db")
        with (
            process(fake_argv, tmp / "fake.log") as fake,
            process(argv, tmp / "gateway.log") as gateway,
        ):
            await wait_ready(f"{upstream}/health", fake, tmp / "fake.log")
            await wait_ready(f"http://127.0.0.1:{port}/health", gateway, tmp / "gateway.log")
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            one = partial(replay_session, url=url, bodies=bodies)

            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
                await asyncio.gather(one(http), one(http))  # warm-up
                # Unsampled first: py-spy stops the process 500 times a second, which
                # changes how calls overlap (the SQLite worker's share among them).
                started, threads = time.perf_counter(), thread_cpu_seconds(gateway.pid)
                await asyncio.gather(*(one(http) for _ in range(sessions)))
                wall = time.perf_counter() - started
                spent = thread_cpu_seconds(gateway.pid)
                threads = {tid: cpu - threads.get(tid, 0.0) for tid, cpu in spent.items()}
                spy_argv = [str(PY_SPY), "record", "-r", "500", "-f", "raw", "-o", str(raw)]
                spy = subprocess.Popen(
                    [*spy_argv, "-p", str(gateway.pid)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                await asyncio.sleep(1.5)  # py-spy attached
                await asyncio.gather(*(one(http) for _ in range(sessions)))
                spy.send_signal(2)
                spy.wait()
    requests = sessions * len(bodies)
    loop_cpu = threads.pop(gateway.pid, 0.0)
    cpu = loop_cpu + sum(threads.values())
    print(f"{requests} requests, {requests / wall:.0f} req/s, {requests / cpu:.0f} req/CPU-s")
    print(
        f"CPU per request: event loop thread {1000 * loop_cpu / requests:.3f} ms,"
        f" other threads {1000 * (cpu - loop_cpu) / requests:.3f} ms"
    )
    print("sampled (a second pass, py-spy attached): each step's share of the loop's samples")
    for step, share in shares(raw).items():
        print(f"{share:5.1f}%  {step}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kb", type=int, default=128, help="history size at the last step")
    parser.add_argument("--sessions", type=int, default=16, help="concurrent sessions")
    parser.add_argument("--raw", type=Path, default=Path("profile.raw.txt"), help="py-spy output")
    args = parser.parse_args()
    asyncio.run(run(args.kb, args.sessions, args.raw))


if __name__ == "__main__":
    main()
