"""The one least-recently-used map of the code base, bounded by the sizes of its entries.

Every per-session cache (decoded requests, renderer caches, store digests, the context
guard's sessions, routing's remembered placements) keeps its entries here. Each entry is
put with its size, the caller's estimate of what it keeps alive: bytes for caches of text
(Python objects cost more than their text, so each cache states its own charge), or 1 for
a bound by entry count. The least recently used entries go until the total fits.

Large requests' steps run in a worker thread (``gateway.offload``) beside the event loop's:
each operation holds the map's lock, so the two threads see it whole.

Ground floor: this module imports nothing of the project. What a cache reports (evictions,
bytes held) goes to callbacks its owner passes, so the serving path's Prometheus series
and the simulator's plain counters use the same map.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

V = TypeVar("V")


def _nothing(_: int) -> None:
    return None


class LRU(Generic[V]):
    """A map of at most ``max_size`` in total entry sizes, least recently used out first.

    ``on_evict(size)`` is called for each entry that goes to make room (not for entries
    replaced or removed by the caller); ``on_size(total)`` after every change of the
    total. A value larger than the whole bound is not kept.
    """

    def __init__(
        self,
        max_size: int,
        *,
        on_evict: Callable[[int], None] = _nothing,
        on_size: Callable[[int], None] = _nothing,
    ) -> None:
        if max_size < 0:
            raise ValueError(f"cache bound must be >= 0, got {max_size}")
        self.max_size = max_size
        self.size = 0
        self._entries: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._on_evict = on_evict
        self._on_size = on_size
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[Hashable]:
        """Keys, least recently used first (not locked: for a map only the loop uses)."""
        return iter(self._entries)

    def get(self, key: Hashable) -> V | None:
        """The value under ``key`` (now the most recently used), or None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def peek(self, key: Hashable) -> V | None:
        """The value under ``key`` without marking it used, or None."""
        entry = self._entries.get(key)
        return None if entry is None else entry[0]

    def put(self, key: Hashable, value: V, size: int = 1) -> None:
        """Keep ``value`` as of ``size``; older entries go until all fit."""
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.size -= old[1]
            if size <= self.max_size:
                self._entries[key] = (value, size)
                self.size += size
            while self.size > self.max_size:
                _, (_, dropped) = self._entries.popitem(last=False)
                self.size -= dropped
                self._on_evict(dropped)
            self._on_size(self.size)

    def pop(self, key: Hashable) -> V | None:
        """Remove ``key``; its value, or None."""
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is None:
                return None
            self.size -= entry[1]
            self._on_size(self.size)
            return entry[0]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.size = 0
            self._on_size(0)
