"""Redis crash durability and outages, each against its own ``redis-server`` process."""

from __future__ import annotations

import asyncio
import re
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from loadtests.local_servers import RedisServer
from store import StoreUnavailable, open_store
from store.redis import RedisStore
from tests.store.conftest import history, msg

pytestmark = pytest.mark.skipif(
    shutil.which("redis-server") is None, reason="needs a local redis-server binary to kill"
)


@pytest.fixture
def durable_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(
        tmp_path / "redis", "--save", "", "--appendonly", "yes", "--appendfsync", "always"
    )
    server.start()
    yield server
    server.stop()


async def test_acknowledged_turns_survive_sigkill(durable_redis: RedisServer) -> None:
    store = open_store(durable_redis.url, timeout_s=2.0)
    try:
        h = history(2)
        for step in range(40):
            h = [*h, msg("assistant", f"step {step}"), msg("tool", "out " * step, tool_call_id="c")]
            await store.ingest("t", "s", h)  # acknowledged once this returns
        await store.append_gateway_turns("t", "s", 0, len(h) - 1, [msg("user", "restored")])
        fork = await store.ingest("t", "s", [*h[:10], msg("user", "edited")])
        await store.add_counts("t", "s", 0, {"requests": 1}, token="r1", record=b"request 1")
        durable_redis.kill()
        durable_redis.start()
        # the same store object reconnects on its own
        loaded = await store.load("t", "s", 0)
        assert list(loaded.messages) == h
        assert list(loaded.gateway_turns[len(h) - 1]) == [msg("user", "restored")]
        assert len((await store.load("t", "s", fork.branch_id)).messages) == 11
        assert await store.get_log("t", "s", 0) == [b"request 1"]
        assert await store.get_counts("t", "s", 0) == {"requests": 1}
        assert (await store.ingest("t", "s", h)).appended == 0
    finally:
        await store.close()


async def test_stopped_redis_fails_fast_then_recovers(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis")
    server.start()
    store = open_store(server.url, timeout_s=0.5)
    try:
        await store.ingest("t", "s", history(3))
        server.stop()
        calls = [
            store.ingest("t", "s", history(4)),
            store.load("t", "s"),
            store.get_assignment("t", "s"),
            store.set_assignment("t", "s", "r1", expected=None, ttl_s=5),
            store.add_counts("t", "s", 0, {"requests": 1}, token="r1"),
            store.list_sessions("t"),
        ]
        for call in calls:
            started = time.monotonic()
            with pytest.raises(StoreUnavailable, match="unavailable"):
                await call
            assert time.monotonic() - started < 0.5 + 0.25
        server.start()  # same port, empty data (no persistence): a fresh Redis
        r = await store.ingest("t", "s", history(4))
        assert (r.step_count, r.appended) == (4, 4)
        assert len((await store.load("t", "s")).messages) == 4
    finally:
        server.stop()
        await store.close()


async def test_hung_redis_times_out(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis")
    server.start()
    store = open_store(server.url, timeout_s=0.3)
    try:
        await store.ingest("t", "s", history(2))
        assert server.proc is not None
        server.proc.send_signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(StoreUnavailable):
                await store.ingest("t", "s", history(3))
            assert time.monotonic() - started < 0.3 + 0.25
        finally:
            server.proc.send_signal(signal.SIGCONT)
        # the interrupted ingest was all-or-nothing: either 2 or 3 messages, never a torn one
        assert len((await store.load("t", "s")).messages) in (2, 3)
        assert (await store.ingest("t", "s", history(3))).step_count == 3
    finally:
        server.stop()
        await store.close()


async def test_session_keys_share_one_hash_tag(redis_url: str) -> None:
    store = open_store(redis_url)
    assert isinstance(store, RedisStore)
    tenant = f"tag-{time.time_ns()}"
    try:
        await store.ingest(tenant, "s/1", [msg("user", "x" * 5000), *history(3)])
        await store.append_gateway_turns(tenant, "s/1", 0, 1, [msg("user", "gw")])
        await store.add_counts(tenant, "s/1", 0, {"requests": 1}, token="r1", record=b"log")
        await store.set_assignment(tenant, "s/1", "r1", expected=None, ttl_s=30)
        client = aioredis.Redis.from_url(redis_url)
        keys = [k.decode() async for k in client.scan_iter(match=f"fg:{{{tenant}*")]
        await client.aclose()
        tags = {re.search(r"\{[^}]*\}", k).group(0) for k in keys}  # type: ignore[union-attr]
        assert tags == {f"{{{tenant}/s%2F1}}"}
        assert len(keys) == 8  # meta chain msgs blobs gw state (the log) counts asg
    finally:
        await store.delete_session(tenant, "s/1")
        await store.close()
        await asyncio.sleep(0)
