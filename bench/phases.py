"""Where one request's wall time goes in a running gateway: ``foldgate serve`` over the
FAKE upstream with the request path's steps timed in the process (wall clock, each call),
``bench/workload.py``'s sessions through it; printed: each step's median and mean
milliseconds per call, the first quarter of the calls left out (warm-up).

Unlike ``bench/profile.py`` (CPU shares, sampled), this says what a request waits for:
the upstream's answer is inside ``open_chat_stream``, the steps before it are what the
gateway adds ahead of the send, ``store_history`` and the reply's stream what it adds after.
Nested steps are each timed whole (``Pipeline.start`` holds ``Forward.send``, which holds
the upstream call and ``Pipeline.store_history``).

    .venv/bin/python bench/phases.py [--kb 128] [--sessions 1] [--rounds 6]
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import functools
import inspect
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from statistics import mean, median
from typing import Any

import aiohttp

# Run as a script: put the repo first, before bench/ (whose store.py shadows the package).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import gateway_argv, process, replay_session, wait_ready
from bench.workload import request_bodies, synthetic_session
from deploy.cpu.replicas import free_ports

OUT_ENV = "FOLDGATE_PHASES_OUT"
# (module, class, method, label), in a request's order.
STEPS = (
    ("gateway.app", "DialectEndpoints", "__call__", "whole request (ASGI)"),
    ("gateway.pipeline", "Pipeline", "serve", "Pipeline.serve (to the reply's start)"),
    ("gateway.steps.decode", "Decoder", "read", "body read + parse"),
    ("gateway.pipeline", "Pipeline", "decode", "decode"),
    ("gateway.pipeline", "Pipeline", "ingest", "store read"),
    ("gateway.pipeline", "Pipeline", "start", "render, route, send, store (start)"),
    ("gateway.pipeline", "Pipeline", "rendered", "render"),
    ("gateway.steps.forward", "Forward", "body", "upstream body"),
    ("gateway.steps.forward", "Forward", "send", "send until accepted"),
    ("gateway.upstream", "UpstreamClient", "open_chat_stream", "upstream, to its first chunk"),
    ("gateway.pipeline", "Pipeline", "store_history", "store write"),
    ("gateway.disconnect", "EventStream", "__call__", "reply streamed back"),
    ("gateway.pipeline", "Pipeline", "replies", "upstream chunks read (in the stream)"),
    ("store.ledger", "Ledger", "add_counts", "accounting write (after the reply)"),
)


def timed(fn: Callable[..., Any], record: Callable[[float], None]) -> Callable[..., Any]:
    """``fn`` with each call's wall time recorded; an async generator's is the time spent
    producing its items, not the time its consumer holds it."""
    if inspect.isasyncgenfunction(fn):

        @functools.wraps(fn)
        async def agen(*args: Any, **kwargs: Any) -> Any:
            spent, items = 0.0, fn(*args, **kwargs)
            try:
                while True:
                    started = time.perf_counter()
                    try:
                        item = await items.__anext__()
                    except StopAsyncIteration:
                        break
                    finally:
                        spent += time.perf_counter() - started
                    yield item
            finally:
                record(spent)

        return agen

    @functools.wraps(fn)
    async def call(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            out = fn(*args, **kwargs)
            return await out if inspect.isawaitable(out) else out
        finally:
            record(time.perf_counter() - started)

    if inspect.iscoroutinefunction(fn):
        return call

    @functools.wraps(fn)
    def sync(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            record(time.perf_counter() - started)

    return sync


def serve_timed(argv: list[str]) -> None:
    """``foldgate serve ARGV`` with ``STEPS`` timed; the times go to $FOLDGATE_PHASES_OUT
    as JSON when the process exits."""
    import importlib

    times: dict[str, list[float]] = {label: [] for *_, label in STEPS}
    for module, cls, method, label in STEPS:
        owner = getattr(importlib.import_module(module), cls)
        setattr(owner, method, timed(getattr(owner, method), times[label].append))
    atexit.register(lambda: Path(os.environ[OUT_ENV]).write_text(json.dumps(times)))
    from gateway.cli import main

    sys.argv = ["foldgate", "serve", *argv]
    main()


async def run(kb: int, sessions: int, rounds: int) -> dict[str, list[float]]:
    steps = 64
    bodies = request_bodies(synthetic_session(steps, kb), steps)
    fake_port, port = free_ports(2)
    upstream = f"http://127.0.0.1:{fake_port}"
    with tempfile.TemporaryDirectory(prefix="fgph-") as folder:
        tmp = Path(folder)
        out = tmp / "phases.json"
        fake_argv = [sys.executable, "-m", "loadtests.fake_upstream", str(fake_port)]
        # ``foldgate serve``'s arguments as the other benchmarks pass them.
        serve = gateway_argv("uvicorn", port, [upstream], f"sqlite:///{tmp}/s.db")[2:]
        argv = [sys.executable, __file__, "--serve-timed", *serve]
        with (
            process(fake_argv, tmp / "fake.log") as fake,
            process(argv, tmp / "gateway.log", env={OUT_ENV: str(out)}) as gateway,
        ):
            await wait_ready(f"{upstream}/health", fake, tmp / "fake.log")
            await wait_ready(f"http://127.0.0.1:{port}/health", gateway, tmp / "gateway.log")
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            one = functools.partial(replay_session, url=url, bodies=bodies)

            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
                for _ in range(rounds):
                    await asyncio.gather(*(one(http) for _ in range(sessions)))
            gateway.send_signal(signal.SIGINT)  # a clean stop, which writes the times
            gateway.wait(60)
        if not out.exists():
            raise RuntimeError(f"the gateway wrote no times: {(tmp / 'gateway.log').read_text()}")
        return json.loads(out.read_text())  # written as the gateway exited


def main() -> None:
    if sys.argv[1:2] == ["--serve-timed"]:
        serve_timed(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kb", type=int, default=128, help="history size at the last step")
    parser.add_argument("--sessions", type=int, default=1, help="concurrent sessions")
    parser.add_argument("--rounds", type=int, default=6, help="sessions run one after another")
    args = parser.parse_args()
    times = asyncio.run(run(args.kb, args.sessions, args.rounds))
    print(f"{args.sessions} session(s) x {args.rounds} rounds x 64 steps, up to {args.kb} KB")
    print(f"{'step':44s} {'calls':>6s} {'median ms':>10s} {'mean ms':>9s}")
    for label, spent in times.items():
        kept = spent[len(spent) // 4 :]
        if kept:
            ms = 1000 * median(kept), 1000 * mean(kept)
            print(f"{label:44s} {len(kept):6d} {ms[0]:10.3f} {ms[1]:9.3f}")


if __name__ == "__main__":
    main()
