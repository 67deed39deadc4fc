"""Fixtures for router tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from tests.router.fake_replica import FakeReplica
from tests.router.support import MemoryAssignments


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


@pytest.fixture
def assignments() -> MemoryAssignments:
    return MemoryAssignments()
