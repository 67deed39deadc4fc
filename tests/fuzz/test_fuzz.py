"""The fuzz suite: generated requests for each dialect (OpenAI chat, Anthropic messages,
OpenAI Responses) and store backend (SQLite, real Redis), against the gateway's app in this
process over the FAKE upstream (``loadtests/fake_upstream.py``): 6,000 per dialect against
each backend in a whole test run (``scripts/test.sh``, what CI runs), 2,000 in the fast loop
(``FOLDGATE_FUZZ_REQUESTS`` sets the number per dialect and backend).

Every answer must be a reply or a 4xx in the dialect's own shape (a bare 499 for a client
that left before its body's end): no 5xx, no connection dropped, and a refused request
leaves the store exactly as it was (a backend-level write counter, read while nothing
else runs and the accounting of earlier replies has landed). Requests come from two
tenants under the same session ids; the other tenant's text (``requests.CANARY``) must
never reach the first one's sessions of those ids or the upstream requests made for it.
The re-sent sessions' branches at the end must extend what they held halfway (an edit
forks).
Every request also goes the full path beside the incremental one (``equivalence.py``):
the re-sent body parsed whole, decoded whole, its history written to a twin store without
a digest cache; bodies, transcripts, errors and store contents must be equal. The figures
per dialect and backend are printed at the end of the run (``conftest.py``).
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import sqlite3
import tempfile
import time
import uuid
import zlib
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

import gateway.app
from gateway.app import create_app
from gateway.config import GatewayConfig
from gateway.tenants import hash_key
from loadtests.fake_upstream import FakeUpstream
from store import NotFound, SessionStore, open_store
from tests.fuzz.equivalence import CheckedBodies, CheckedDecodeCache, MirroredStore
from tests.fuzz.exchange import Answer, error_shape, post, reply_shape
from tests.fuzz.requests import CANARY, DIALECTS, GROWING, Mutator, Request, pool

# Per dialect and backend. With each request's full path beside it (``equivalence.py``) a
# request costs about 1.6x what it did without, so scripts/test.sh (CI) runs 6,000, the CPU
# 10,000 took before (6 x 10,000 was about 165 s on the 2-core machine); the fast loop 2,000.
REQUESTS = int(os.environ.get("FOLDGATE_FUZZ_REQUESTS", "2000"))
POOL = 40
CONCURRENCY = int(os.environ.get("FOLDGATE_FUZZ_CONCURRENCY", "4"))
# Another seed, other requests: for a longer hunt by hand (CI runs seed 0).
SEED = os.environ.get("FOLDGATE_FUZZ_SEED", "0")
RESULTS: list[dict] = []  # printed by conftest.pytest_terminal_summary


def sqlite_writes(path: Path) -> Callable[[], int]:
    """SQLite's ``data_version``: changes whenever another connection commits."""
    conn = sqlite3.connect(path)
    return lambda: conn.execute("PRAGMA data_version").fetchone()[0]


def redis_writes(url: str) -> Callable[[], int]:
    """Redis's count of writes since its last save (the test server never saves)."""
    client = redis.Redis.from_url(url)
    return lambda: int(client.info("persistence")["rdb_changes_since_last_save"])


@pytest.fixture
async def fake() -> AsyncIterator[FakeUpstream]:
    upstream = await FakeUpstream().start()
    yield upstream
    await upstream.stop()


@functools.cache
def bodies(dialect_name: str) -> list[dict]:
    """The dialect's pool of valid bodies, drawn once per run (both backends use it)."""
    return pool(DIALECTS[dialect_name], POOL)


def judge(dialect_name: str, answer: Answer, cut: bool = False) -> str | None:
    """What is wrong with an answer, or None: dropped, 5xx, or not in the dialect's shape
    (``cut``: the client left before its body's end and reads nothing: a bare 499 does)."""
    status = answer.status or 0
    if answer.dropped is not None:
        return answer.dropped
    if status >= 500:
        return f"HTTP {status}"
    if status == 499 and cut:
        return None
    if status >= 400:
        return error_shape(dialect_name, answer.body)
    return reply_shape(dialect_name, answer)


async def branches(store: SessionStore, tenant: str, session: str) -> list[tuple[Any, ...]]:
    """The messages of each of a session's branches, by branch id (none: no session)."""
    found: list[tuple[Any, ...]] = []
    while True:
        try:
            found.append((await store.load(tenant, session, len(found))).messages)
        except NotFound:
            return found


def overwritten(
    session: str, before: list[tuple[Any, ...]], after: list[tuple[Any, ...]]
) -> list[str]:
    """How a session's branches ``after`` fail to extend them ``before`` (the history is
    append-only: an edit forks)."""
    if len(after) < len(before):
        return [f"session {session!r}: {len(before)} branches, then {len(after)}"]
    return [
        f"session {session!r} branch {i}: {str(old)[:200]} became {str(new)[:200]}"
        for i, (old, new) in enumerate(zip(before, after, strict=False))
        if new[: len(old)] != old
    ]


def other_tenant_text(
    sessions: dict[str, list[tuple[Any, ...]]], salt: str | None, upstream: list[dict]
) -> list[str]:
    """Where the other tenant's text (``CANARY``) shows in the first tenant's ``sessions``
    (their branches: those whose ids the other tenant sends under) or in the upstream
    requests made for it (those carrying its cache ``salt``)."""
    canary = CANARY.encode()
    found = [
        f"session {session!r}: {str(messages)[:300]}"
        for session, history in sessions.items()
        for messages in history
        if canary in orjson.dumps(messages)
    ]
    found += [
        f"upstream request {str(body)[:300]}"
        for body in upstream
        if body.get("cache_salt") == salt and canary in orjson.dumps(body)
    ]
    return found


@pytest.mark.fuzz
@pytest.mark.parametrize("backend", ["sqlite", "redis"])
@pytest.mark.parametrize("dialect_name", list(DIALECTS))
async def test_fuzz(dialect_name, backend, fake, request, monkeypatch):
    """Every request, ``CONCURRENCY`` at a time (sessions collide, as agents' retries do),
    each answer judged. Over a batch that was all refused the store's write counter must
    not move; a refused request that ran beside an accepted one is sent again alone."""
    dialect = DIALECTS[dialect_name]
    if backend == "sqlite":
        # On tmpfs where there is one: commits are fsynced, and the fuzz is about answers.
        root = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
        folder = Path(tempfile.mkdtemp(prefix="foldgate-fuzz-", dir=root))
        request.addfinalizer(lambda: shutil.rmtree(folder, ignore_errors=True))
        store_url = f"sqlite:///{folder}/store.db"
    else:
        store_url = request.getfixturevalue("redis_url")
    # Two tenants: the requests' own, and the other one, which sends under the same
    # session ids (``Mutator.other_tenant``).
    run = uuid.uuid4().hex[:8]
    tenants = (f"fuzz-{run}", f"fuzz-{run}-other")
    keys = [f"fuzz-key-{run}-{i}" for i in range(2)]
    config = GatewayConfig(
        store_url=store_url,
        replicas=(fake.url,),
        probe_interval_s=3600,
        api_keys={hash_key(key): tenant for key, tenant in zip(keys, tenants, strict=True)},
        # The first tenant's clients may set vLLM's priority, which the gateway scales.
        tenants={tenants[0]: {"upstream_fields": ["priority"]}},
        upstream_priority=True,
    )
    authorization = [[(b"authorization", f"Bearer {key}".encode())] for key in keys]
    # The store's 2 s call timeout answers 503 when a loaded machine starves the event loop;
    # outages are the fault tests' subject, answers to hostile input this one's.
    # Every history call is repeated on a twin store without a digest cache (the full path).
    twin_options = {"namespace": "fgfull"} if backend == "redis" else {}
    twin_url = store_url if backend == "redis" else f"sqlite:///{folder}/full.db"
    mismatches: list[str] = []

    def mirrored(url: str, **options: object) -> MirroredStore:
        twin = open_store(twin_url, timeout_s=30, digest_cache_bytes=0, **twin_options)
        return MirroredStore(open_store(url, **{**options, "timeout_s": 30}), twin, mismatches)

    monkeypatch.setattr(gateway.app, "open_store", mirrored)
    started = time.perf_counter()
    seed = zlib.crc32(f"{dialect_name}/{backend}/{SEED}".encode())
    mutator = Mutator(dialect, bodies(dialect_name), seed=seed)
    requests = [mutator.next() for _ in range(REQUESTS)]
    app = create_app(config)
    statuses: Counter[int] = Counter()
    failures: list[str] = []

    def failed(n: int, req: Request, answer: Answer, problem: str) -> None:
        failures.append(
            f"#{n} {req.kind}: {problem}: {req.body[:300]!r} {req.headers!r} -> "
            f"{answer.status} {answer.body[:300]!r}"
        )

    async with app.router.lifespan_context(app):
        writes = (
            sqlite_writes(folder / "store.db") if backend == "sqlite" else redis_writes(store_url)
        )
        pipeline = app.state.pipeline
        # Each parse and decode beside the full path's.
        decoder = pipeline.decoder
        decoder.bodies = CheckedBodies(config.decode_cache_bytes, config.max_messages, mismatches)
        decoder.cache = CheckedDecodeCache(
            config.decode_cache_bytes, config.max_messages, mismatches
        )

        def send(req: Request) -> Awaitable[Answer]:
            key = authorization[req.tenant] if req.tenant is not None else []
            return post(app, dialect.path, req.body, [*key, *req.headers], req.cut)

        checked = 0  # refused requests seen to leave the store as it was
        unchecked: list[int] = []  # refused, but beside a request that wrote
        # The re-sent sessions' branches halfway, which the end must extend.
        grown = [(t, f"grow-{name}") for t in tenants for name in range(GROWING)]
        halfway: dict[tuple[str, str], list[tuple[Any, ...]]] = {}
        for at in range(0, REQUESTS, CONCURRENCY):
            if not halfway and at >= REQUESTS // 2:
                await pipeline.drain()
                halfway = {key: await branches(pipeline.store, *key) for key in grown}
            batch = range(at, min(at + CONCURRENCY, REQUESTS))
            await pipeline.drain()
            before = writes()
            answers = await asyncio.gather(*(send(requests[n]) for n in batch))
            await pipeline.drain()
            wrote = writes() != before
            refused = [
                n for n, a in zip(batch, answers, strict=True) if 400 <= (a.status or 0) < 500
            ]
            if len(refused) == len(batch) and wrote:
                unchecked += refused  # found alone below
            elif len(refused) == len(batch):
                checked += len(refused)
            else:
                unchecked += refused
            for n, answer in zip(batch, answers, strict=True):
                statuses[answer.status or 0] += 1
                problem = judge(dialect_name, answer, requests[n].cut is not None)
                if problem is not None:
                    failed(n, requests[n], answer, problem)
        # Refused requests that ran beside an accepted one: again, alone.
        for n in unchecked:
            await pipeline.drain()
            before = writes()
            answer = await send(requests[n])
            await pipeline.drain()
            if not 400 <= (answer.status or 0) < 500:
                continue  # accepted this time (the state moved on): nothing to check
            checked += 1
            if writes() != before:
                failed(n, requests[n], answer, "a refused request wrote to the store")
        await pipeline.drain()
        for tenant in tenants:
            await pipeline.store.compare(tenant)
        end = {key: await branches(pipeline.store, *key) for key in grown}
        for (tenant, session), before in halfway.items():
            failures += overwritten(session, before, end[tenant, session])
        first = {session: end[tenant, session] for tenant, session in grown if tenant == tenants[0]}
        leaks = other_tenant_text(first, pipeline.tenants.cache_salt(tenants[0]), fake.requests)
    elapsed = time.perf_counter() - started
    RESULTS.append(
        {
            "dialect": dialect_name,
            "backend": backend,
            "requests": REQUESTS,
            "ok": sum(c for s, c in statuses.items() if s < 300),
            "4xx": sum(c for s, c in statuses.items() if 400 <= s < 500),
            "5xx": sum(c for s, c in statuses.items() if s >= 500),
            "refused_checked": checked,
            "failures": len(failures),
            "seconds": round(elapsed, 1),
            "statuses": dict(sorted(statuses.items())),
        }
    )
    assert not failures, f"{len(failures)} failures, first: " + "\n".join(failures[:10])
    assert not leaks, "the other tenant's text reached the first one's: " + "\n".join(leaks[:10])
    assert not mismatches, f"{len(mismatches)} differences from the full path, first: " + "\n".join(
        mismatches[:10]
    )
    assert sum(statuses.values()) == REQUESTS
    refused_total = sum(c for s, c in statuses.items() if 400 <= s < 500)
    assert checked >= 0.95 * refused_total, "refused requests were checked against the store"
