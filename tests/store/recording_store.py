"""A backend that only records which hook each contract method reached, and with what."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Self

from store import (
    Assign,
    Charge,
    HeldLease,
    IngestResult,
    LeaseClaim,
    Lookup,
    Refusal,
    SessionStore,
    StoredHistory,
)
from store.codec import PackedMessage
from store.digests import PackedHistory


class RecordingStore(SessionStore):
    def __init__(self, url: str = "recording://", **options: Any) -> None:
        super().__init__(**options)
        self.url = url
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        return cls(url, **options)

    def _called(self, hook: str, *args: Any) -> None:
        self.calls.append((hook, args))

    async def store_history(
        self, tenant: str, session: str, history: PackedHistory, cap: int, assign: Assign | None
    ) -> IngestResult:
        self._called("store_history", tenant, session, history, cap, assign)
        return IngestResult(0, len(history.packed), len(history.packed), True)

    async def find_history(
        self, tenant: str, session: str, history: PackedHistory, cap: int
    ) -> Lookup:
        self._called("find_history", tenant, session, history, cap)
        return Lookup(None, 0, {}, {}, None)

    async def load_branch(
        self, tenant: str, session: str, branch: int | None, with_messages: bool
    ) -> StoredHistory:
        self._called("load_branch", tenant, session, branch, with_messages)
        return StoredHistory(0, ())

    async def store_gateway_turns(
        self,
        tenant: str,
        session: str,
        branch: int,
        after_index: int,
        packed: Sequence[PackedMessage],
    ) -> None:
        self._called("store_gateway_turns", tenant, session, branch, after_index, packed)

    async def live_sessions(self, tenant: str) -> list[str]:
        self._called("live_sessions", tenant)
        return []

    async def page_sessions(
        self, tenant: str, limit: int, after: tuple[float, str] | None
    ) -> list[tuple[str, float]]:
        self._called("page_sessions", tenant, limit, after)
        return []

    async def drop_session(self, tenant: str, session: str) -> bool:
        self._called("drop_session", tenant, session)
        return False

    async def record_counts(
        self,
        tenant: str,
        session: str,
        branch: int,
        counts: Mapping[str, int],
        token: str,
        latest: Mapping[str, int],
        record: bytes | None,
    ) -> None:
        self._called("record_counts", tenant, session, branch, counts, token, latest, record)

    async def read_log(self, tenant: str, session: str, branch: int) -> list[bytes]:
        self._called("read_log", tenant, session, branch)
        return []

    async def read_counts(self, tenant: str, session: str, branch: int) -> dict[str, int]:
        self._called("read_counts", tenant, session, branch)
        return {}

    async def read_tenant_counts(self, tenant: str) -> dict[str, int]:
        self._called("read_tenant_counts", tenant)
        return {}

    async def take_charges(
        self,
        tenant: str,
        charges: Sequence[Charge],
        session: str | None,
        max_sessions: int | None,
        lease: LeaseClaim | None,
    ) -> Refusal | None:
        self._called("take_charges", tenant, charges, session, max_sessions, lease)
        return None

    async def extend_leases(self, leases: Sequence[HeldLease], period_s: float) -> list[HeldLease]:
        self._called("extend_leases", leases, period_s)
        return []

    async def drop_lease(self, lease: HeldLease) -> None:
        self._called("drop_lease", lease)

    async def read_assignment(self, tenant: str, session: str) -> str | None:
        self._called("read_assignment", tenant, session)
        return None

    async def write_assignment(self, tenant: str, session: str, assign: Assign) -> str:
        self._called("write_assignment", tenant, session, assign)
        return assign.replica

    async def keep_reply(self, tenant: str, reply_id: str, data: bytes) -> None:
        self._called("keep_reply", tenant, reply_id, data)

    async def read_reply(self, tenant: str, reply_id: str) -> bytes | None:
        self._called("read_reply", tenant, reply_id)
        return None

    async def close(self) -> None:
        self._called("close")
