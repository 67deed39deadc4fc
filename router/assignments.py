"""The session -> replica assignment map the sticky policy needs, as a Protocol.

The store package implements it (SQLite and Redis); the router depends only on this shape.
"""

from __future__ import annotations

from typing import Protocol


class AssignmentStore(Protocol):
    async def get_assignment(self, tenant: str, session: str) -> str | None:
        """The replica URL the session is assigned to, or None (never set or expired)."""
        ...

    async def set_assignment(
        self, tenant: str, session: str, replica: str, *, expected: str | None, ttl_s: float
    ) -> str:
        """Set to `replica` if the current value equals `expected` (or nothing holds the
        session any more); refresh the TTL.

        Returns the assignment in force afterwards: `replica`, or a concurrent writer's value.
        """
        ...
