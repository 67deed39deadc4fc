"""A prefix-cache simulator with vLLM's automatic-prefix-caching semantics.

The prompt is cut into full blocks of ``block_size`` token ids; a trailing partial block is
never cached. Block ``i``'s hash is ``hash((hash of block i-1, token ids of block i))``, so a
hash names the whole prefix up to the end of its block. A request's cached tokens are the
longest run of leading blocks whose hashes are resident. Capacity is in blocks with LRU
eviction; evicting a block leaves its descendants resident but unreachable (the lookup stops
at the first miss), exactly as in vLLM, until LRU evicts them too.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

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
        # hash -> None, ordered least- to most-recently used.
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.prompt_tokens = 0
        self.cached_tokens = 0
        # The previous request's ids and block hashes: an agent's next prompt usually extends
        # the last one, so its leading hashes are reused instead of recomputed.
        self._last_ids: list[int] = []
        self._last_hashes: list[int] = []

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._blocks

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

    def _touch(self, hashes: list[int], capacity: int) -> None:
        # Tail blocks first, so a prompt's beginning is its most recently used part: under
        # pressure the ends of prompts go before their shared beginnings (vLLM frees blocks
        # in reverse order for the same reason).
        for h in reversed(hashes):
            if h in self._blocks:
                self._blocks.move_to_end(h)
            else:
                self._blocks[h] = None
        while len(self._blocks) > capacity:
            self._blocks.popitem(last=False)

    def request(self, ids: Sequence[int]) -> RequestResult:
        """Serve one prompt: count its cache hit, then keep its blocks (LRU order updated)."""
        hashes = self.block_hashes(ids)
        # vLLM always computes at least the last prompt token, so a fully cached,
        # block-aligned prompt still recomputes its last block.
        max_hit_blocks = min(len(hashes), (len(ids) - 1) // self.block_size if ids else 0)
        hit = 0
        while hit < max_hit_blocks and hashes[hit] in self._blocks:
            hit += 1
        cached = hit * self.block_size
        if self.capacity_blocks is None:
            # Nothing is ever evicted, so recency does not matter: only add the new blocks.
            self._blocks.update(dict.fromkeys(hashes[hit:]))
        else:
            self._touch(hashes, self.capacity_blocks)
        self.prompt_tokens += len(ids)
        self.cached_tokens += cached
        return RequestResult(
            prompt_tokens=len(ids),
            cached_tokens=cached,
            uncached_tokens=len(ids) - cached,
            blocks_in_use=len(self._blocks),
        )
