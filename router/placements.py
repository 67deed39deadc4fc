"""Where a policy placed each recently routed key (a session, a shared prefix), as this
gateway saw it, and how many keys each replica holds: what the fit and prefix scorers
read. Bounded: the least recently placed keys drop out."""

from __future__ import annotations

from collections import Counter

from gateway.lru import LRU

Key = tuple[str, str]  # (tenant, session) or (tenant, prefix key)


class Placements:
    def __init__(self, limit: int = 65_536) -> None:
        self._where: LRU[str] = LRU(limit)
        self._count: Counter[str] = Counter()

    def home(self, key: Key) -> str | None:
        return self._where.peek(key)

    def count(self, url: str) -> int:
        """Keys placed on ``url``."""
        return self._count[url]

    def place(self, key: Key, url: str) -> None:
        self.forget(key)
        # Count the oldest key out before the LRU would drop it to make room.
        if self._where and len(self._where) >= self._where.max_size:
            self.forget(next(iter(self._where)))  # type: ignore[arg-type]
        self._where.put(key, url)
        self._count[url] += 1

    def forget(self, key: Key) -> None:
        url = self._where.pop(key)
        if url is not None:
            self._count[url] -= 1
