"""Gateway memory per session: RSS of a served gateway before and after N distinct sessions.

The gateway runs as ``foldgate serve`` (uvicorn, SQLite store) in a subprocess in front of
the FAKE instant upstream (``loadtests/fake_upstream.py``). Each of ``--sessions`` sessions
sends ``--requests`` requests of ``bench/workload.py``'s synthetic agent session, growing to
about ``--kb`` KB; every session's tool outputs carry its own tag, so no two sessions share
text. RSS (``VmRSS`` of the gateway process) is read after a warm-up session and after all
sessions; the gateway's own cache-eviction counters are read from ``/metrics``. The caches'
byte bounds are the gateway's config (``FOLDGATE_DECODE_CACHE_BYTES``,
``FOLDGATE_RENDER_CACHE_BYTES`` in the environment reach the served gateway).

    .venv/bin/python bench/memory.py [--sessions 600] [--kb 256] [--requests 2]
        [--concurrency 8] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

# Run as a script: put the repo first, before bench/ (whose store.py shadows the package).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import gateway_argv, post, process, wait_ready
from bench.workload import TOOLS, synthetic_session
from deploy.cpu.replicas import free_ports

STEPS = 16


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def session_bodies(template: list[dict[str, Any]], tag: str, requests: int) -> list[bytes]:
    """The session's requests: the template with ``tag`` in every message, so its text is
    its own; the last request carries the whole history."""
    messages = [
        {**m, "content": f"[{tag}] {m['content']}"} if isinstance(m.get("content"), str) else m
        for m in template
    ]
    steps = (len(messages) - 2) // 2
    ends = [2 + 2 * max(1, steps * (r + 1) // requests) for r in range(requests)]
    return [
        json.dumps(
            {
                "model": "fake-model",
                "messages": messages[:end],
                "tools": TOOLS,
                "stream": False,
                "max_tokens": 16,
            }
        ).encode()
        for end in ends
    ]


def cache_metrics(text: str) -> dict[str, float]:
    """The per-session caches' samples in the Prometheus text (evictions, bytes held)."""
    out = {}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith("foldgate_session_cache_") and "_created" not in name:
            out[name] = float(value)
    return out


async def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    fake_port, gateway_port = free_ports(2)
    upstream = f"http://127.0.0.1:{fake_port}"
    gateway = f"http://127.0.0.1:{gateway_port}"
    template = synthetic_session(STEPS, args.kb)
    fake_argv = [sys.executable, "-m", "loadtests.fake_upstream", str(fake_port)]
    argv = gateway_argv("uvicorn", gateway_port, upstream, f"sqlite:///{tmp}/mem.db")
    with (
        process(fake_argv, tmp / "fake.log") as fake,
        process(argv, tmp / "gateway.log") as gw,
    ):
        await wait_ready(f"{upstream}/health", fake, tmp / "fake.log")
        await wait_ready(f"{gateway}/health", gw, tmp / "gateway.log")
        url = f"{gateway}/v1/chat/completions"
        json_type = {"content-type": "application/json"}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:

            async def one(index: int) -> None:
                headers = {**json_type, "x-session-id": f"mem-{index}-{uuid.uuid4().hex[:8]}"}
                for body in session_bodies(template, f"s{index}", args.requests):
                    await post(http, url, body, headers)

            await one(-1)  # warm-up: imports, first-request costs
            before = rss_mb(gw.pid)
            queue = iter(range(args.sessions))

            async def worker() -> None:
                for index in queue:
                    await one(index)

            await asyncio.gather(*(worker() for _ in range(args.concurrency)))
            await asyncio.sleep(0.5)  # accounting after the last replies
            after = rss_mb(gw.pid)
            async with http.get(f"{gateway}/metrics") as resp:
                metrics = cache_metrics(await resp.text())
    return {
        "sessions": args.sessions,
        "session_kb": len(session_bodies(template, "s0", args.requests)[-1]) / 1024,
        "requests_per_session": args.requests,
        "rss_mb_before": before,
        "rss_mb_after": after,
        "rss_kb_per_session": (after - before) * 1024 / args.sessions,
        "metrics": metrics,
    }


async def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=600, help="distinct sessions")
    parser.add_argument("--kb", type=int, default=256, help="history size of each session")
    parser.add_argument("--requests", type=int, default=2, help="requests per session")
    parser.add_argument("--concurrency", type=int, default=8, help="sessions at once")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    if args.sessions < 1 or args.requests < 1 or args.concurrency < 1:
        parser.error("--sessions, --requests and --concurrency must be >= 1")
    with tempfile.TemporaryDirectory(prefix="fgm-") as tmp:
        result = await run(args, Path(tmp))
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"{result['sessions']} sessions of {result['session_kb']:.0f} KB "
        f"({result['requests_per_session']} requests each): gateway RSS "
        f"{result['rss_mb_before']:.0f} -> {result['rss_mb_after']:.0f} MB "
        f"({result['rss_kb_per_session']:.0f} KB per session)"
    )
    for name, value in sorted(result["metrics"].items()):
        print(f"  {name} {value:g}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
