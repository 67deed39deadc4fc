"""A prefix-cache simulator with vLLM's automatic-prefix-caching semantics.

The prompt is cut into full blocks of ``block_size`` token ids; a trailing partial block is
never cached. Block ``i``'s hash is ``hash((hash of block i-1, token ids of block i))``, so a
hash names the whole prefix up to the end of its block. A request's cached tokens are the
longest run of leading blocks whose hashes are resident. Capacity is in blocks with LRU
eviction; evicting a block leaves its descendants resident but unreachable (the lookup stops
at the first miss), exactly as in vLLM, until LRU evicts them too.

:class:`BlockPool` is the cache itself, as one engine's KV pool with reference counts;
:class:`PrefixCache` is that pool serving one request at a time (each request holds its
blocks and lets go at once), which is what an offline replay of one session needs. The
cluster simulator drives a ``BlockPool`` directly, with running requests holding blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# Parent "hash" of the first block; any fixed value works, it only seeds the chain.
_ROOT = 0x5EED


@dataclass(frozen=True, slots=True)
class RequestResult:
    prompt_tokens: int
    cached_tokens: int
    uncached_tokens: int
    blocks_in_use: int  # blocks resident in the cache after this request


class PrefixCache:
    """One engine's block cache. ``capacity_blocks=None`` never evicts."""

    def __init__(self, block_size: int = 16, capacity_blocks: int | None = None) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if capacity_blocks is not None and capacity_blocks < 1:
            raise ValueError(f"capacity_blocks must be >= 1 or None, got {capacity_blocks}")
        self.block_size = block_size
        self.capacity_blocks = capacity_blocks
        # Exact LRU (evict one block at a time); "no capacity" is a pool nothing fills.
        self._pool = BlockPool(capacity_blocks or _UNBOUNDED, evict_batch=1)
        self._ids: dict[int, int] = {}  # block hash -> the pool's dense id
        self.prompt_tokens = 0
        self.cached_tokens = 0
        # The previous request's ids and block hashes: an agent's next prompt usually extends
        # the last one, so its leading hashes are reused instead of recomputed.
        self._last_ids: list[int] = []
        self._last_hashes: list[int] = []

    def __len__(self) -> int:
        return self._pool.cached

    def __contains__(self, block_hash: int) -> bool:
        i = self._ids.get(block_hash)
        return i is not None and bool(self._pool.resident[i])

    def evict(self, block_hash: int) -> None:
        """Drop one block now, as LRU would once it is the least recently used."""
        i = self._ids.get(block_hash)
        if i is not None and self._pool.resident[i]:
            self._pool.drop(np.asarray([i]))

    @property
    def hit_rate(self) -> float:
        """Cumulative cached / prompt tokens over every request so far."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def block_hashes(self, ids: Sequence[int]) -> list[int]:
        """Chained hashes of the full blocks of ``ids``."""
        ids = list(ids)  # own copy: the caller may reuse its list
        bs = self.block_size
        n_full = len(ids) // bs
        reuse = self._shared_blocks(ids, n_full)
        hashes = self._last_hashes[:reuse]
        parent = hashes[-1] if hashes else _ROOT
        for b in range(reuse, n_full):
            parent = hash((parent, tuple(ids[b * bs : (b + 1) * bs])))
            hashes.append(parent)
        self._last_ids, self._last_hashes = ids, hashes
        return hashes

    def _shared_blocks(self, ids: list[int], n_full: int) -> int:
        """How many leading full blocks ``ids`` shares with the previous request."""
        bs = self.block_size
        hi = min(n_full, len(self._last_hashes))
        if hi == 0 or ids[: hi * bs] == self._last_ids[: hi * bs]:
            return hi
        lo = 0  # invariant: the first lo blocks match, block hi-1 does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if ids[: mid * bs] == self._last_ids[: mid * bs]:
                lo = mid
            else:
                hi = mid
        return lo

    def request(self, ids: Sequence[int]) -> RequestResult:
        """Serve one prompt: count its cache hit, then keep its blocks (LRU order updated)."""
        hashes = self.block_hashes(ids)
        dense = np.fromiter(
            (self._ids.setdefault(h, len(self._ids)) for h in hashes), np.int64, len(hashes)
        )
        self._pool.ensure(len(self._ids))
        # vLLM always computes at least the last prompt token, so a fully cached,
        # block-aligned prompt still recomputes its last block.
        max_hit_blocks = min(len(hashes), (len(ids) - 1) // self.block_size if ids else 0)
        cached = self._pool.hits(dense, max_hit_blocks) * self.block_size
        # The request holds its blocks while it runs and lets go when done: its beginning
        # becomes the most recently used. A prompt longer than the pool keeps its beginning.
        held = dense[: self._pool.capacity]
        self._pool.acquire(held)
        self._pool.release(held)
        self.prompt_tokens += len(ids)
        self.cached_tokens += cached
        return RequestResult(
            prompt_tokens=len(ids),
            cached_tokens=cached,
            uncached_tokens=len(ids) - cached,
            blocks_in_use=self._pool.cached,
        )


_NO_IDS = np.zeros(0, dtype=np.int64)

# A capacity no replay reaches, for caches that never evict.
_UNBOUNDED = 2**62


class BlockPool:
    """The same model for an engine that holds requests: one vLLM v1 KV pool.

    :class:`PrefixCache` serves one request at a time and lets it go at once; an engine
    keeps its running requests' blocks. Here a block is referenced while a running request
    holds it and can then never be evicted; released, a full block keeps its hash and stays
    cached but counts as free (vLLM's free queue), in LRU order, until an allocation needs
    its slot. Held blocks without a hash (the partial last block, decode tokens) are
    ``anonymous``. Blocks are named by dense integer ids (chained hashes mapped to ids by
    the caller) so the pool is a few arrays and a lookup over thousands of blocks is one
    vector operation.

    Eviction takes the least recently released blocks in batches of ``evict_batch`` (at
    least what the allocation needs), a small departure from one-at-a-time LRU that keeps
    the cost per allocation low.
    """

    def __init__(self, capacity_blocks: int, n_ids: int = 0, evict_batch: int | None = None):
        if capacity_blocks < 1:
            raise ValueError(f"capacity_blocks must be >= 1, got {capacity_blocks}")
        self.capacity = capacity_blocks
        self.evict_batch = max(1, capacity_blocks // 64) if evict_batch is None else evict_batch
        self.resident = np.zeros(n_ids, dtype=bool)
        self.refs = np.zeros(n_ids, dtype=np.int32)
        self.stamp = np.zeros(n_ids, dtype=np.int64)
        self.referenced = 0  # hashed blocks some running request holds
        self.anonymous = 0  # held blocks without a hash
        self.cached = 0  # hashed blocks resident, referenced or not
        self.evicted = 0
        self._clock = 0
        # Ids made resident, in chunks (some since dropped): eviction looks among these
        # instead of scanning the whole id space, which grows with every session.
        self._resident_ids: list[np.ndarray] = []

    @property
    def used(self) -> int:
        return self.referenced + self.anonymous

    @property
    def free(self) -> int:
        """Blocks an allocation may take: never used or cached but unreferenced."""
        return self.capacity - self.used

    @property
    def usage(self) -> float:
        """vLLM's ``kv_cache_usage_perc``: cached unreferenced blocks count as free."""
        return self.used / self.capacity

    def ensure(self, n_ids: int) -> None:
        """Grow the id space to at least ``n_ids``."""
        size = len(self.resident)
        if n_ids <= size:
            return
        grown = max(n_ids, 2 * size)
        self.resident = np.concatenate([self.resident, np.zeros(grown - size, dtype=bool)])
        self.refs = np.concatenate([self.refs, np.zeros(grown - size, dtype=np.int32)])
        self.stamp = np.concatenate([self.stamp, np.zeros(grown - size, dtype=np.int64)])

    def hits(self, ids: Any, limit: int) -> int:
        """How many leading blocks of ``ids[:limit]`` are cached."""
        if limit <= 0:
            return 0
        found = self.resident[ids[:limit]]
        return limit if found.all() else int(found.argmin())

    def acquire(self, ids: Any, anonymous: int = 0) -> bool:
        """Hold the hashed blocks ``ids`` (distinct; cached ones are reused, the others
        allocated and cached) and ``anonymous`` more unhashed blocks (negative: give some
        back, as when a partial block fills up and gets its hash). False, with nothing
        changed, when they do not fit."""
        if not len(ids):  # the common case, a decode step: no array work
            if anonymous > self.free:
                return False
            self.anonymous += anonymous
            shortfall = self.anonymous + self.cached - self.capacity
            if shortfall > 0:
                self._evict(shortfall)
            return True
        refs = self.refs[ids]
        newly = ids[refs == 0]
        if len(newly) + anonymous > self.free:
            return False
        fresh = newly[~self.resident[newly]]
        self.refs[ids] += 1
        self.referenced += len(newly)
        self.anonymous += anonymous
        # Slots for fresh blocks come from never-used ones first, then from the LRU cache.
        # Occupied slots: anonymous blocks and every cached block, held or not.
        shortfall = self.anonymous + self.cached + len(fresh) - self.capacity
        if shortfall > 0:
            self._evict(shortfall)
        self.resident[fresh] = True
        self._resident_ids.append(fresh)
        self.cached += len(fresh)
        return True

    def release(self, ids: Any, anonymous: int = 0) -> None:
        """Let go of blocks a request held. Its first blocks become the most recently used,
        so under pressure the ends of prompts go before their shared beginnings (vLLM frees
        a request's blocks in reverse order for the same reason)."""
        if len(ids):
            self.refs[ids] -= 1
            self.referenced -= int((self.refs[ids] == 0).sum())
            self.touch(ids)
        self.anonymous -= anonymous

    def touch(self, ids: Any) -> None:
        """Make these blocks the most recently used, the first of them most of all."""
        self.stamp[ids] = self._clock + np.arange(len(ids), 0, -1)
        self._clock += len(ids) + 1

    def _evict(self, needed: int) -> None:
        chunks = self._resident_ids
        ids = chunks[0] if len(chunks) == 1 else np.concatenate([_NO_IDS, *chunks])
        ids = ids[self.resident[ids]]
        if len(ids) != self.cached:  # dropped by `drop` and made resident again: twice
            ids = np.unique(ids)
        self._resident_ids = [ids]
        candidates = ids[self.refs[ids] == 0]
        take = min(len(candidates), max(needed, self.evict_batch))
        if take <= 0:
            return
        if take < len(candidates):
            oldest = np.argpartition(self.stamp[candidates], take - 1)[:take]
            candidates = candidates[oldest]
        self.drop(candidates)
        self._resident_ids = [ids[self.resident[ids]]]

    def drop(self, ids: Any) -> None:
        """Evict these cached, unreferenced blocks."""
        self.resident[ids] = False
        self.cached -= len(ids)
        self.evicted += len(ids)
