"""Gateway memory per session: RSS of a served gateway before and after N distinct sessions,
against what its caches charge, for each shape of session.

The gateway runs as ``foldgate serve`` (uvicorn, SQLite store) in a subprocess in front of
the FAKE instant upstream (``loadtests/fake_upstream.py``), a fresh pair per shape:

- ``long``: ``bench/workload.py``'s synthetic agent session of 16 tool steps growing to
  about ``--kb`` KB (long tool outputs);
- ``short``: ``--messages`` messages of a few dozen bytes (tool calls answered by one-line
  outputs), the shape whose per-message objects outweigh its text;
- ``tools``: a short session sent with ``--tools-kb`` KB of tool schemas of its own, to an
  upstream that reports ``max_model_len`` (so the context guard is on).

Each session sends ``--requests`` requests, the last with the whole history; every session's
text carries its own tag, so no two share it. RSS (``VmRSS`` of the gateway process) is read
after a warm-up session and after all sessions; the caches' charged bytes and evictions come
from the gateway's ``/metrics``. Per shape it prints the RSS growth, the charged bytes, their
ratio, and whether RSS stayed within the configured cache bounds (``--cache-mb`` each for the
decode, render and store digest caches, and the resent bodies' cache, which takes the decode
cache's bound) plus ``CONSTANT_MB``. A request the gateway sheds (503: at its
``max_concurrency``, or a replica's overload passed on) is an answer: counted and printed,
the session goes on with its next request.

    .venv/bin/python bench/memory.py [--shapes long,short,tools] [--long-sessions 600]
        [--short-sessions 600] [--tools-sessions 600] [--kb 256] [--messages 600]
        [--tools-kb 60] [--requests 2] [--cache-mb 128] [--concurrency 8] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp

# Run as a script: put the repo first, before bench/ (whose store.py shadows the package).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import gateway_argv, process, wait_ready
from bench.workload import TOOLS, synthetic_session
from deploy.cpu.replicas import free_ports

STEPS = 16
SHAPES = ("long", "short", "tools")
# Caches bounded by ``--cache-mb`` each: decode, resent bodies, render, store digests.
CACHES = 4
# What the gateway holds besides its caches once warm, whatever the number of sessions:
# the context guard's and routing's per-session state (bounded by entry counts, a few
# hundred bytes each), the store's SQLite page cache, the allocator's free lists.
CONSTANT_MB = 64
# A context window the fake upstream reports for the ``tools`` shape: large enough that no
# session compacts, so the guard only keeps its per-session state.
WINDOW = 1_000_000
FAKE_WITH_WINDOW = """
import asyncio, sys
from loadtests.fake_upstream import FakeUpstream
async def serve():
    await FakeUpstream(record=False, max_model_len=int(sys.argv[2])).start(int(sys.argv[1]))
    await asyncio.Event().wait()
asyncio.run(serve())
"""


async def answered(http: aiohttp.ClientSession, url: str, body: bytes, headers: dict) -> int:
    """POST ``body``; the answer's status (read to its end)."""
    async with http.post(url, data=body, headers=headers) as resp:
        await resp.read()
        return resp.status


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def short_session(messages: int) -> list[dict[str, Any]]:
    """System + task, then tool calls each answered by a one-line output."""
    out: list[dict[str, Any]] = [
        {"role": "system", "content": "a coding agent"},
        {"role": "user", "content": "list what changed"},
    ]
    for step in range((messages - 2) // 2):
        call = {"id": f"call_{step}", "type": "function"}
        call["function"] = {"name": "bash", "arguments": json.dumps({"cmd": f"stat f{step}"})}
        out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        out.append({"role": "tool", "tool_call_id": f"call_{step}", "content": f"f{step}: ok"})
    return out


def large_tools(kb: int, tag: str) -> list[dict[str, Any]]:
    """About ``kb`` KB of tool schemas, described in the session's own words."""
    return [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": f"[{tag}] tool {i}: " + "does one documented thing. " * 36,
                "parameters": {"type": "object", "properties": {"arg": {"type": "string"}}},
            },
        }
        for i in range(max(1, kb))
    ]


def session_bodies(
    template: list[dict[str, Any]], tag: str, requests: int, tools: list[dict[str, Any]]
) -> list[bytes]:
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
                "tools": tools,
                "stream": False,
                "max_tokens": 16,
            }
        ).encode()
        for end in ends
    ]


def shape_bodies(args: argparse.Namespace, shape: str) -> Callable[[str], list[bytes]]:
    """A session's request bodies for ``shape``, given its tag."""
    if shape == "long":
        template = synthetic_session(STEPS, args.kb)
        return lambda tag: session_bodies(template, tag, args.requests, TOOLS)
    if shape == "short":
        template = short_session(args.messages)
        return lambda tag: session_bodies(template, tag, args.requests, TOOLS)
    template = synthetic_session(STEPS, 16)
    return lambda tag: session_bodies(template, tag, args.requests, large_tools(args.tools_kb, tag))


def cache_metrics(text: str) -> dict[str, float]:
    """The per-session caches' samples in the Prometheus text (evictions, bytes held)."""
    out = {}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith("foldgate_session_cache_") and "_created" not in name:
            out[name] = float(value)
    return out


async def run(args: argparse.Namespace, shape: str, tmp: Path) -> dict[str, Any]:
    fake_port, gateway_port = free_ports(2)
    upstream = f"http://127.0.0.1:{fake_port}"
    gateway = f"http://127.0.0.1:{gateway_port}"
    sessions = getattr(args, f"{shape}_sessions")
    bodies = shape_bodies(args, shape)
    fake_argv = [sys.executable, "-m", "loadtests.fake_upstream", str(fake_port)]
    if shape == "tools":
        fake_argv = [sys.executable, "-c", FAKE_WITH_WINDOW, str(fake_port), str(WINDOW)]
    argv = gateway_argv("uvicorn", gateway_port, [upstream], f"sqlite:///{tmp}/{shape}.db")
    cache_bytes = str(args.cache_mb * 1024 * 1024)
    env = {f"FOLDGATE_{name}_CACHE_BYTES": cache_bytes for name in ("DECODE", "RENDER", "DIGEST")}
    with (
        process(fake_argv, tmp / f"{shape}-fake.log") as fake,
        process(argv, tmp / f"{shape}-gateway.log", env) as gw,
    ):
        await wait_ready(f"{upstream}/health", fake, tmp / f"{shape}-fake.log")
        await wait_ready(f"{gateway}/health", gw, tmp / f"{shape}-gateway.log")
        url = f"{gateway}/v1/chat/completions"
        json_type = {"content-type": "application/json"}
        statuses: Counter[int] = Counter()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:

            async def one(index: int) -> None:
                headers = {**json_type, "x-session-id": f"mem-{index}-{uuid.uuid4().hex[:8]}"}
                for body in bodies(f"s{index}"):
                    statuses[await answered(http, url, body, headers)] += 1

            await one(-1)  # warm-up: imports, first-request costs
            before = rss_mb(gw.pid)
            queue = iter(range(sessions))

            async def worker() -> None:
                for index in queue:
                    await one(index)

            await asyncio.gather(*(worker() for _ in range(args.concurrency)))
            await asyncio.sleep(0.5)  # accounting after the last replies
            after = rss_mb(gw.pid)
            async with http.get(f"{gateway}/metrics") as resp:
                metrics = cache_metrics(await resp.text())
    charged_mb = sum(
        v for k, v in metrics.items() if k.startswith("foldgate_session_cache_bytes")
    ) / (1024 * 1024)
    growth = after - before
    bound = CACHES * args.cache_mb + CONSTANT_MB
    if set(statuses) - {200, 503}:
        raise RuntimeError(f"{shape}: the gateway answered {dict(statuses)}")
    return {
        "shape": shape,
        "sessions": sessions,
        "session_kb": len(bodies("s0")[-1]) / 1024,
        "requests_per_session": args.requests,
        "rss_mb_before": before,
        "rss_mb_after": after,
        "rss_growth_mb": growth,
        "rss_kb_per_session": growth * 1024 / sessions,
        "charged_mb": charged_mb,
        "charged_over_growth": charged_mb / growth if growth > 0 else None,
        "bound_mb": bound,
        "within_bound": growth <= bound,
        "shed_503": statuses[503],
        "requests": sum(statuses.values()),
        "metrics": metrics,
    }


async def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated shapes")
    for shape in SHAPES:
        parser.add_argument(
            f"--{shape}-sessions", type=int, default=600, help=f"sessions of shape {shape}"
        )
    parser.add_argument("--kb", type=int, default=256, help="history size of a long session")
    parser.add_argument("--messages", type=int, default=600, help="messages of a short one")
    parser.add_argument("--tools-kb", type=int, default=60, help="tool schemas of a tools one")
    parser.add_argument("--requests", type=int, default=2, help="requests per session")
    parser.add_argument("--cache-mb", type=int, default=128, help="bound of each cache")
    parser.add_argument("--concurrency", type=int, default=8, help="sessions at once")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    shapes = [s for s in args.shapes.split(",") if s]
    if unknown := set(shapes) - set(SHAPES):
        parser.error(f"unknown shapes {sorted(unknown)}; known: {', '.join(SHAPES)}")
    counts = [getattr(args, f"{s}_sessions") for s in SHAPES]
    if min(counts) < 1 or args.requests < 1 or args.concurrency < 1:
        parser.error("session counts, --requests and --concurrency must be >= 1")
    results = []
    with tempfile.TemporaryDirectory(prefix="fgm-") as tmp:
        for shape in shapes:
            results.append(await run(args, shape, Path(tmp)))
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    for r in results:
        ratio = r["charged_over_growth"]
        print(
            f"{r['shape']}: {r['sessions']} sessions of {r['session_kb']:.0f} KB "
            f"({r['requests_per_session']} requests each): gateway RSS "
            f"{r['rss_mb_before']:.0f} -> {r['rss_mb_after']:.0f} MB "
            f"(+{r['rss_growth_mb']:.0f} MB, {r['rss_kb_per_session']:.0f} KB per session); "
            f"caches charge {r['charged_mb']:.0f} MB "
            f"(charged/growth {'-' if ratio is None else f'{ratio:.2f}'}); "
            f"growth {'within' if r['within_bound'] else 'OVER'} bound {r['bound_mb']} MB; "
            f"{r['shed_503']} of {r['requests']} requests shed (503)"
        )
        for name, value in sorted(r["metrics"].items()):
            print(f"  {name} {value:g}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
