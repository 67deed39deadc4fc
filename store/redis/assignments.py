"""The Redis backend's assignments: one key per session beside its others (same tag)."""

from __future__ import annotations

from store.assignments import Assign, Assignments
from store.redis import scripts
from store.redis.database import RedisDatabase


class RedisAssignments(Assignments):
    db: RedisDatabase

    async def read_assignment(self, tenant: str, session: str) -> str | None:
        key = self.db.keys.assignment(tenant, session)
        async with self.db.guard():
            value = await self.db.client.get(key)
        return value.decode() if value is not None else None

    async def write_assignment(self, tenant: str, session: str, assign: Assign) -> str:
        key = self.db.keys.assignment(tenant, session)
        args = [
            "0" if assign.expected is None else "1",
            assign.expected or "",
            assign.replica,
            max(1, int(assign.ttl_s * 1000)),
        ]
        async with self.db.guard():
            value = await self.db.script(scripts.SET_ASSIGNMENT)(keys=[key], args=args)
        return value.decode()
