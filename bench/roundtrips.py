"""Store round trips per request: what one ordinary request costs the session store.

A gateway (uvicorn, in this process) in front of the FAKE instant upstream
(``loadtests/fake_upstream.py``) serves one synthetic agent session (``bench/workload.py``'s
workload) request by request, on each store backend. Every store method call is counted by
name, and so is every real round trip to the backend: an SQLite transaction (one job on the
store's worker thread) or a Redis command or pipeline sent. Accounting runs after the reply
(the client does not wait for it), so the bench waits for it before the next request and
counts it with the request it belongs to. The first request (a new session) and the later
ones (the steady state) are reported apart. No quota limits are configured (a tenant's
limits add their own ``charge`` calls).

    .venv/bin/python bench/roundtrips.py [--steps 8] [--backends sqlite,redis]
        [--redis-url redis://...] [--policy sticky]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline as RedisPipeline
from rich.console import Console
from rich.table import Table

# Run as a script: put the repo first, before bench/ (whose store.py shadows the package).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.workload import request_bodies, synthetic_session
from gateway.config import GatewayConfig
from loadtests.fake_upstream import FakeUpstream
from loadtests.local_servers import RedisServer, running_gateway
from store import SessionStore
from store.redis import RedisStore
from store.sqlite import SQLiteStore
from store.sqlite.database import SQLiteDatabase

SETTLE_S = 0.05


class Tally:
    """Store calls by method name and backend round trips, since the last ``take``."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.trips = 0

    def take(self) -> tuple[Counter[str], int]:
        out = (self.calls, self.trips)
        self.calls, self.trips = Counter(), 0
        return out


@contextmanager
def patched(owner: type, name: str, wrap: Callable[[Any], Any]) -> Iterator[None]:
    original = owner.__dict__[name]
    setattr(owner, name, wrap(original))
    try:
        yield
    finally:
        setattr(owner, name, original)


def store_methods(backend: type[SessionStore]) -> list[tuple[type, str]]:
    """The public async methods of the store contracts, as (defining class, name) to wrap:
    not the backend's hooks they call (abstract on the contracts), nor ``close``."""
    methods = []
    for n in dir(SessionStore):
        v = getattr(SessionStore, n)
        if n.startswith("_") or not callable(v) or getattr(v, "__isabstractmethod__", False):
            continue
        methods.append((next(c for c in backend.__mro__ if n in vars(c)), n))
    return methods


@contextmanager
def counting(tally: Tally, backend: type[SessionStore]) -> Iterator[None]:
    def method(original: Any, name: str) -> Any:
        async def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            tally.calls[name] += 1
            return await original(self, *args, **kwargs)

        return counted

    def trip(original: Any) -> Any:
        async def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            # A pipeline's execute_command only queues; its execute is the round trip.
            if not isinstance(self, RedisPipeline) or original.__name__ != "execute_command":
                tally.trips += 1
            return await original(self, *args, **kwargs)

        return counted

    with ExitStack() as stack:
        for owner, name in store_methods(backend):
            stack.enter_context(patched(owner, name, lambda o, n=name: method(o, n)))
        if backend is SQLiteStore:
            stack.enter_context(patched(SQLiteDatabase, "run", trip))
        else:
            stack.enter_context(patched(aioredis.Redis, "execute_command", trip))
            stack.enter_context(patched(RedisPipeline, "execute", trip))
            # What a pipeline sends at once (e.g. redis-py's SCRIPT EXISTS before scripts).
            stack.enter_context(patched(RedisPipeline, "immediate_execute_command", trip))
        yield


async def measure(store_url: str, backend: type[SessionStore], args: argparse.Namespace) -> dict:
    bodies = request_bodies(synthetic_session(args.steps, args.kb), args.steps)
    fake = await FakeUpstream().start()
    tally = Tally()
    per_request: list[tuple[Counter[str], int]] = []
    config = GatewayConfig(
        store_url=store_url, replicas=(fake.url,), policy=args.policy, probe_interval_s=60
    )
    headers = {"content-type": "application/json", "x-session-id": f"rt-{uuid.uuid4()}"}
    try:
        with counting(tally, backend):
            async with (
                running_gateway(config) as url,
                httpx.AsyncClient(base_url=url, timeout=30) as http,
            ):
                await http.get("/v1/models")  # model discovery before counting
                tally.take()
                for body in bodies:
                    resp = await http.post("/v1/chat/completions", content=body, headers=headers)
                    resp.raise_for_status()
                    await asyncio.sleep(SETTLE_S)  # accounting, after the reply
                    per_request.append(tally.take())
    finally:
        await fake.stop()
    first_calls, first_trips = per_request[0]
    later = per_request[1:]
    calls: Counter[str] = Counter()
    for c, _ in later:
        calls.update(c)
    return {
        "first_calls": dict(first_calls),
        "first_trips": first_trips,
        "calls": {k: v / len(later) for k, v in calls.items()},
        "trips": sum(t for _, t in later) / len(later),
    }


def print_rows(rows: dict[str, dict]) -> None:
    table = Table(title="store round trips per request (FAKE upstream, no quota limits)")
    for name in ("backend", "request", "round trips", "store calls"):
        table.add_column(name, justify="right" if name == "round trips" else "left")
    for backend, r in rows.items():
        for label, trips, calls in (
            ("first (new session)", r["first_trips"], r["first_calls"]),
            ("later (mean)", r["trips"], r["calls"]),
        ):
            listed = ", ".join(f"{k} {v:g}" for k, v in sorted(calls.items()))
            table.add_row(backend, label, f"{trips:g}", listed)
    Console(width=160).print(table)


async def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8, help="requests in the session")
    parser.add_argument("--kb", type=int, default=32, help="history size at the last step")
    parser.add_argument("--backends", default="sqlite,redis", help="comma list: sqlite, redis")
    parser.add_argument("--redis-url", help="a Redis to use (default: a redis-server started)")
    parser.add_argument("--policy", default="sticky", help="routing policy")
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("need --steps >= 2")
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="fgrt-") as tmp:
        for backend in args.backends.split(","):
            if backend == "sqlite":
                rows[backend] = await measure(f"sqlite:///{tmp}/rt.db", SQLiteStore, args)
            elif backend == "redis":
                server = None
                url = args.redis_url
                if url is None:
                    server = RedisServer(Path(tmp) / "redis")
                    server.start()
                    url = server.url
                try:
                    rows[backend] = await measure(url, RedisStore, args)
                finally:
                    if server is not None:
                        server.stop()
            else:
                parser.error(f"unknown backend {backend!r}")
    print_rows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
