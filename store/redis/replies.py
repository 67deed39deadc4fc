"""The Redis backend's kept replies: one key per reply under the tenant's tag."""

from __future__ import annotations

from store.redis.database import RedisDatabase
from store.replies import KeptReplies


class RedisReplies(KeptReplies):
    db: RedisDatabase

    async def keep_reply(self, tenant: str, reply_id: str, data: bytes) -> None:
        key = self.db.keys.reply(tenant, reply_id)
        async with self.db.guard():
            await self.db.client.set(key, data, px=self.db.ttl_ms)

    async def read_reply(self, tenant: str, reply_id: str) -> bytes | None:
        key = self.db.keys.reply(tenant, reply_id)
        async with self.db.guard():
            value: bytes | None = await self.db.client.get(key)
        return value
