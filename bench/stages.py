"""Where the gateway's CPU time goes per request (``bench/overhead.py --stages``): the
pipeline's own steps called one by one, in this process, on an SQLite store.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from statistics import median

import orjson
from rich.console import Console
from rich.table import Table

from gateway.config import GatewayConfig
from gateway.dialects.openai_chat import OPENAI_CHAT
from gateway.identity import identify
from gateway.pipeline import Pipeline
from gateway.upstream import UpstreamClient
from router import ReplicaPool, make_policy
from store import open_store


async def stage_times(
    bodies: list[bytes], strategy: str, bucket: int, tmp: Path
) -> dict[str, dict[str, float]]:
    """Per-step CPU time of each pipeline step, median over the small and full buckets."""
    config = GatewayConfig(store_url=f"sqlite:///{tmp}/stages-{strategy}.db", strategy=strategy)
    store = open_store(config.store_url)
    policy = make_policy("sticky", assignments=store)
    # The pool and the upstream client are never used: nothing here leaves the process.
    pool = ReplicaPool(("http://127.0.0.1:9",))
    pipeline = Pipeline(config, store, pool, policy, UpstreamClient())
    session = f"stages-{uuid.uuid4()}"
    headers = {config.session_header: session}
    times: dict[str, list[float]] = {}

    def lap(name: str, started: float) -> float:
        now = time.perf_counter()
        times.setdefault(name, []).append(now - started)
        return now

    try:
        for raw in bodies:
            t = time.perf_counter()
            caller = identify(headers, config, pipeline.tenants, pipeline.render.spec)
            # As the app does: only what the session's previous request lacked is parsed
            # (the bytes after its last item) and decoded.
            key = (caller.tenant, OPENAI_CHAT.name, session)
            body = pipeline.decoder.bodies.parse(raw, key, OPENAI_CHAT.items_field)
            t = lap("parse body", t)
            decoded = await pipeline.decode(OPENAI_CHAT, body, headers, caller.tenant)
            t = lap("decode + raw token estimate", t)
            ingested = await pipeline.ingest(caller, decoded, body, headers)
            t = lap("ingest: read (store lookup)", t)
            rendering = pipeline.rendered(ingested)
            t = lap("render + token estimate", t)
            orjson.dumps(pipeline.forward.body(ingested, rendering.transcript))
            t = lap("encode upstream body", t)
            # As after an upstream accepted the request (the renderer cache kept too).
            stored = await pipeline.store_history(ingested, rendering, None)
            t = lap("ingest: write (store)", t)
            await store.add_counts(
                "default", session, stored.branch, {"requests": 1}, token=uuid.uuid4().hex
            )
            lap("account (counter increments)", t)
    finally:
        await store.close()
    ms = 1000.0
    return {
        name: {"small": median(v[:bucket]) * ms, "full": median(v[-bucket:]) * ms}
        for name, v in times.items()
    }


def print_stages(stages: dict[str, dict[str, dict[str, float]]]) -> None:
    table = Table(title="gateway time per request by step (in process, wall ms, median)")
    table.add_column("step")
    for strategy in stages:
        table.add_column(f"{strategy} small", justify="right")
        table.add_column(f"{strategy} full", justify="right")
    names = next(iter(stages.values()))
    for name in [*names, "total"]:
        cells = []
        for per_step in stages.values():
            for size in ("small", "full"):
                if name == "total":
                    cells.append(f"{sum(v[size] for v in per_step.values()):.3f}")
                else:
                    cells.append(f"{per_step[name][size]:.3f}")
        table.add_row(name, *cells)
    Console(width=160).print(table)
