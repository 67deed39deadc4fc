"""``SessionStore``: every contract of the store on one object, as a backend provides it.

The contracts, one concern each: ``Histories`` (store.histories), ``Ledger`` (counters,
request logs, quota charges: store.ledger), ``Assignments`` (store.assignments) and
``KeptReplies`` (store.replies). Each public method checks its arguments once, then calls
the backend's hook for it; a backend implements the hooks only.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, Self

from store.assignments import Assignments
from store.digests import DEFAULT_DIGEST_CACHE_BYTES, CacheCallbacks, DigestCache
from store.histories import Histories
from store.ledger import Ledger
from store.replies import KeptReplies

DEFAULT_TTL_S = 7 * 24 * 3600.0
DEFAULT_MAX_SESSION_BYTES = 64 * 1024 * 1024
DEFAULT_TIMEOUT_S = 2.0


class SessionStore(Histories, Ledger, Assignments, KeptReplies):
    """Append-only session histories, their counters and request logs, quota counters, the
    router's assignment map and kept replies.

    ``digest_cache_callbacks``: the digest cache's ``on_evict`` / ``on_size`` (e.g.
    ``gateway.metrics.cache_callbacks("store_digests")``).
    """

    def __init__(
        self,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        max_session_bytes: int = DEFAULT_MAX_SESSION_BYTES,
        digest_cache_bytes: int = DEFAULT_DIGEST_CACHE_BYTES,
        digest_cache_callbacks: CacheCallbacks | None = None,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be positive, got {ttl_s}")
        if max_session_bytes <= 0:
            raise ValueError(f"max_session_bytes must be positive, got {max_session_bytes}")
        self.ttl_s = ttl_s
        self.max_session_bytes = max_session_bytes
        # The per-process memory of each session's last request (its bound, its size).
        self.digest_cache = DigestCache(digest_cache_bytes, **(digest_cache_callbacks or {}))

    @classmethod
    @abstractmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        """The store ``url`` names (a scheme ``store.registry.BACKENDS`` gives this class)."""

    @abstractmethod
    async def close(self) -> None:
        """Release connections; the store must not be used afterwards."""
