"""The kept-replies contract: finished replies' records by id, per tenant, for the store's
TTL (the Responses API's stored responses, which later requests continue from)."""

from __future__ import annotations

from abc import ABC, abstractmethod

from store.checks import check_id


class KeptReplies(ABC):
    """Reply records by (tenant, id). The public methods check their arguments, then call
    the backend's hooks (``keep_reply``, ``read_reply``)."""

    async def put_reply(self, tenant: str, reply_id: str, data: bytes) -> None:
        """Keep a finished reply's record under its id (a repeated put replaces it)."""
        await self.keep_reply(check_id("tenant", tenant), check_id("reply", reply_id), data)

    async def get_reply(self, tenant: str, reply_id: str) -> bytes | None:
        """The record ``put_reply`` kept, or None (never kept, expired, other tenant)."""
        return await self.read_reply(check_id("tenant", tenant), check_id("reply", reply_id))

    @abstractmethod
    async def keep_reply(self, tenant: str, reply_id: str, data: bytes) -> None:
        """``put_reply`` with checked arguments."""

    @abstractmethod
    async def read_reply(self, tenant: str, reply_id: str) -> bytes | None:
        """``get_reply`` with checked arguments."""
