"""The HTTP hops' alternatives, measured on the plain relay (``bench/relay.py``) in one loop.

Each variant is a relay process with one setting changed from what foldgate runs (uvicorn
with httptools on uvloop, ``gateway.upstream``'s aiohttp client reading line by line): the
server's protocol (h11), its event loop (asyncio), the upstream client (aiohttp read in
chunks; aiohttp read by lines without the per-line timeout; httpx). All of them sit in
front of the same fake instant upstream (``loadtests/fake_upstream.py``) and take the same
requests in rotating order, with the direct call beside them (``bench/peer_fronts.curve``:
sessions opened first, then timed), so the machine's drift hits every variant alike. Added
latency p50/p99 against the direct call and requests per CPU-second of each relay process,
per history size and concurrency.

    .venv/bin/python bench/hops.py [--tokens 36000,200000] [--sessions 1,16]
        [--samples 128] [--per-session 4] [--variants NAME,...] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

# Run as a script: put the repo first, before bench/ (whose store.py shadows the package).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import ROOT, process, wait_ready
from bench.peer_fronts import curve
from deploy.cpu.replicas import free_ports

# name -> bench/relay.py's options; the first is foldgate's own stack (the floor).
VARIANTS: dict[str, list[str]] = {
    "httptools+uvloop+foldgate": [],
    "h11+uvloop+foldgate": ["--http", "h11"],
    "httptools+asyncio+foldgate": ["--loop", "asyncio"],
    "httptools+uvloop+aiohttp-chunks": ["--client", "aiohttp-chunks"],
    "httptools+uvloop+aiohttp-lines": ["--client", "aiohttp-lines"],
    "httptools+uvloop+httpx": ["--client", "httpx"],
}


async def measure(args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    names = args.variants.split(",") if args.variants else list(VARIANTS)
    fake_port, *ports = free_ports(1 + len(names))
    upstream = f"http://127.0.0.1:{fake_port}"
    with ExitStack() as running:
        fake_log = tmp / "fake.log"
        fake_argv = [sys.executable, "-m", "loadtests.fake_upstream", str(fake_port)]
        fake = running.enter_context(process(fake_argv, fake_log))
        relays = {}
        for name, port in zip(names, ports, strict=True):
            argv = [sys.executable, str(ROOT / "bench" / "relay.py"), "--port", str(port)]
            argv += ["--upstream", upstream, *VARIANTS[name]]
            log = tmp / f"{name}.log"
            relay = running.enter_context(process(argv, log))
            relays[name] = (f"http://127.0.0.1:{port}", relay, log)
        await wait_ready(f"{upstream}/health", fake, fake_log)
        for url, proc, log in relays.values():
            await wait_ready(f"{url}/health", proc, log)
        fronts = {name: url for name, (url, _, _) in relays.items()}
        pids = {name: proc.pid for name, (_, proc, _) in relays.items()}
        sizes = [int(t) for t in args.tokens.split(",") if t]
        sessions = [int(c) for c in args.sessions.split(",") if c]
        return await curve(
            fronts, pids, upstream, sizes, sessions, args.steps, args.samples, args.per_session
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="36000,200000", help="history sizes (tokens)")
    parser.add_argument("--sessions", default="1,16", help="concurrent sessions")
    parser.add_argument("--samples", type=int, default=128, help="timed requests per point")
    parser.add_argument("--per-session", type=int, default=4, help="timed requests a session")
    parser.add_argument("--steps", type=int, default=64, help="steps of each session")
    parser.add_argument("--variants", default="", help=f"comma list of {', '.join(VARIANTS)}")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    unknown = set(filter(None, args.variants.split(","))) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variant(s): {', '.join(sorted(unknown))}")
    with tempfile.TemporaryDirectory(prefix="fgh-") as tmp:
        rows = asyncio.run(measure(args, Path(tmp)))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = Table(title="relay variants vs direct (FAKE instant upstream), one loop")
    for name in ("variant", "history tok", "sessions", "added ms p50 / p99", "req/CPU-s",
                 "CPU-s", "samples", "failed"):  # fmt: skip
        table.add_column(name, justify="left" if name == "variant" else "right")
    for r in rows:
        table.add_row(
            r["front"], f"{r['history_tokens']:,}", str(r["sessions"]),
            f"{r['added_ms_p50']:.2f} / {r['added_ms_p99']:.2f}", f"{r['req_per_cpu_s']:.0f}",
            f"{r['cpu_s']:.2f}", str(r["samples"]), str(r["failed"]),
        )  # fmt: skip
    Console(width=160).print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
