"""The assignments contract: which replica serves a session, set by compare-and-set.

Shaped as ``router.assignments.AssignmentStore``, which the sticky routing policy needs.
An assignment expires on its own (``ttl_s``), so a replica that went away holds nothing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from store.checks import check_id, check_ttl


@dataclass(frozen=True, slots=True)
class Assign:
    """Set the session's replica assignment with an ingest, as ``set_assignment`` would:
    to ``replica`` if it currently is ``expected`` (or absent), for ``ttl_s``."""

    replica: str
    expected: str | None
    ttl_s: float


def check_assign(assign: Assign | None) -> None:
    if assign is not None:
        check_id("replica", assign.replica)
        check_ttl("assignment", assign.ttl_s)


class Assignments(ABC):
    """The session -> replica map. The public methods check their arguments, then call the
    backend's hook of the same concern (``read_assignment``, ``write_assignment``)."""

    async def get_assignment(self, tenant: str, session: str) -> str | None:
        """The replica the session is assigned to, or None."""
        return await self.read_assignment(check_id("tenant", tenant), check_id("session", session))

    async def set_assignment(
        self, tenant: str, session: str, replica: str, *, expected: str | None, ttl_s: float
    ) -> str:
        """Set the assignment to ``replica`` if it currently is ``expected`` and refresh its TTL.

        An absent (expired) assignment is free to take whatever ``expected`` says, since no
        one holds it. Returns the assignment in force afterwards: ``replica``, or the value a
        concurrent writer set.
        """
        check_id("tenant", tenant)
        check_id("session", session)
        assign = Assign(replica, expected, ttl_s)
        check_assign(assign)
        return await self.write_assignment(tenant, session, assign)

    @abstractmethod
    async def read_assignment(self, tenant: str, session: str) -> str | None:
        """``get_assignment`` with checked arguments."""

    @abstractmethod
    async def write_assignment(self, tenant: str, session: str, assign: Assign) -> str:
        """``set_assignment`` with checked arguments, atomically."""
