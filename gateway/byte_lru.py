"""A least-recently-used map bounded by the bytes its values hold, for per-session caches.

Per-session caches (the decode cache, the renderers' caches) hold a session's text; a
bound by session count lets a few long sessions take gigabytes. Each entry here is put
with its size, the caller's estimate of the memory it keeps alive (measured per cache:
Python objects cost more than their text, ReFold's 6-7x, see
``gateway.steps.render.cache_memory``), and the least recently used entries go until the
total fits. Evictions and the bytes held are Prometheus series
labelled by the cache's name.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

from gateway import metrics

V = TypeVar("V")


class ByteLRU(Generic[V]):
    def __init__(self, name: str, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"{name} cache bound must be >= 0 bytes, got {max_bytes}")
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._evictions = metrics.CACHE_EVICTIONS.labels(cache=name)
        self._held = metrics.CACHE_BYTES.labels(cache=name)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> V | None:
        """The value under ``key`` (now the most recently used), or None."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: Hashable, value: V, size: int) -> None:
        """Keep ``value`` as holding ``size`` bytes; older entries go until all fit. A value
        larger than the whole bound is not kept."""
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        if size <= self.max_bytes:
            self._entries[key] = (value, size)
            self.bytes += size
        while self.bytes > self.max_bytes:
            _, (_, dropped) = self._entries.popitem(last=False)
            self.bytes -= dropped
            self._evictions.inc()
        self._held.set(self.bytes)
