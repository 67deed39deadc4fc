"""Fixtures for router tests: fake replica servers and the real store's assignment map."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from store import SessionStore, open_store
from tests.router.fake_replica import FakeReplica


@pytest.fixture
async def fake_replicas() -> AsyncIterator[Callable[[int], Awaitable[list[FakeReplica]]]]:
    started: list[FakeReplica] = []

    async def start(n: int) -> list[FakeReplica]:
        replicas = [FakeReplica() for _ in range(n)]
        for r in replicas:
            await r.start()
        started.extend(replicas)
        return replicas

    yield start
    for r in started:
        await r.stop()


@pytest.fixture(params=["sqlite", "redis"])
async def assignments(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[SessionStore]:
    """The sticky policy's assignment map on each real store backend."""
    if request.param == "sqlite":
        store = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    else:
        # A namespace of its own: the Redis server is shared by the whole test session.
        redis_url = request.getfixturevalue("redis_url")
        store = open_store(redis_url, namespace=f"router-test-{uuid.uuid4().hex}")
    try:
        yield store
    finally:
        await store.close()
