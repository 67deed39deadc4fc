"""The routing policy's surroundings in the simulator: its assignment store in a dict, and
the driver that runs its ``choose`` without an event loop (the store never suspends)."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

from store import Assign

T = TypeVar("T")


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (the policy over an in-memory store)."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("a routing coroutine suspended; the simulator's store never does")


class MemoryAssignments:
    """The AssignmentStore contract in a dict, with no TTL: simulated sessions end
    explicitly and are forgotten then. ``read`` and ``write`` are what the gateway's
    history lookup and history write do with a session's assignment (``store.Assign``'s
    compare-and-set)."""

    def __init__(self) -> None:
        self._map: dict[tuple[str, str], str] = {}

    def read(self, tenant: str, session: str) -> str | None:
        return self._map.get((tenant, session))

    def write(self, tenant: str, session: str, assign: Assign) -> str:
        """Set to ``assign.replica`` if the assignment is ``assign.expected`` or absent;
        the assignment in force afterwards."""
        current = self._map.get((tenant, session))
        if current is None or current == assign.expected:
            self._map[(tenant, session)] = assign.replica
            return assign.replica
        return current

    async def get_assignment(self, tenant: str, session: str) -> str | None:
        return self.read(tenant, session)

    async def set_assignment(
        self, tenant: str, session: str, replica: str, *, expected: str | None, ttl_s: float
    ) -> str:
        return self.write(tenant, session, Assign(replica, expected, ttl_s))

    def forget(self, tenant: str, session: str) -> None:
        self._map.pop((tenant, session), None)
