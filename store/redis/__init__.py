"""Redis backend: redis-py asyncio + hiredis, one pool per store, atomic Lua writes; one
module per contract.

Same contracts and model as every backend (``store.session_store``). The tenant's session
index is kept best-effort beside the atomic per-session writes (a session is listed after
its first successful ingest). Key names: ``store.redis.keys``; layout and scripts:
``store.redis.scripts``. Create one store per process.
"""

from __future__ import annotations

from typing import Any, Self

from store.redis.assignments import RedisAssignments
from store.redis.database import RedisDatabase
from store.redis.histories import RedisHistories
from store.redis.ledger import RedisLedger
from store.redis.replies import RedisReplies
from store.session_store import DEFAULT_TIMEOUT_S, SessionStore


class RedisStore(RedisHistories, RedisLedger, RedisAssignments, RedisReplies, SessionStore):
    """Every contract on one Redis (or Cluster) at ``url`` (``db``)."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        namespace: str = "fg",
        max_connections: int = 64,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.db = RedisDatabase(
            url,
            timeout_s=timeout_s,
            namespace=namespace,
            max_connections=max_connections,
            ttl_s=self.ttl_s,
        )

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        """``redis://``, ``rediss://`` or ``unix://`` URLs, as redis-py reads them."""
        return cls(url, **options)

    async def close(self) -> None:
        await self.db.close()


__all__ = ["RedisStore"]
