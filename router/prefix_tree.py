"""vLLM router's approximate prefix trees, over chained block keys instead of characters.

vllm-router's ``cache_aware`` keeps one radix tree of the request texts it sent, each node
marked with the replicas it went to and when (``src/tree.rs``); a prompt's match on a
replica is how many of its leading characters that replica's part of the tree holds, and an
eviction pass trims each replica's part to ``max_tree_size`` characters, least recently
used leaves first. Here a prompt is its chain of block keys (each key names the whole
prefix up to its block, as vLLM's block hashes do), so a replica's part of the tree is the
set of keys it was sent, and the match is the longest run of leading keys in that set.
Sizes count characters as the gateway estimates them (``BYTES_PER_TOKEN`` per token).

A key's rank records when its path was last sent and how deep it is, so eviction drops the
least recently used keys first and, among keys sent together, the deepest first: the set
stays closed under prefixes, and the longest match is found by bisection.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.tokens import BYTES_PER_TOKEN

_DEPTH = 1 << 24  # deeper than any prompt's chain of blocks


class PrefixTrees:
    def __init__(self, block_size: int, max_chars: int) -> None:
        self.block_size = block_size
        self.max_keys = max(1, max_chars // (block_size * BYTES_PER_TOKEN))
        self._keys: dict[str, dict[int, int]] = {}
        self._sent = 0

    def matched(self, replica: str, chain: Sequence[int]) -> int:
        """Tokens of the prompt ``chain`` that ``replica``'s tree holds, from its start."""
        keys = self._keys.get(replica)
        if not keys or not chain:
            return 0
        lo, hi = 0, len(chain)  # chain[:lo] is held; chain[:hi + 1] is not
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if chain[mid - 1] in keys:
                lo = mid
            else:
                hi = mid - 1
        return lo * self.block_size

    def insert(self, replica: str, chain: Sequence[int]) -> None:
        """``replica`` was sent the prompt ``chain``: its whole path is now the most recent."""
        self._sent += 1
        top = self._sent * _DEPTH + _DEPTH - 1
        keys = self._keys.setdefault(replica, {})
        keys.update(zip(chain, range(top, top - len(chain), -1), strict=False))

    def size(self, replica: str) -> int:
        """Keys held for ``replica``."""
        return len(self._keys.get(replica, ()))

    def evict(self) -> None:
        """Trim every replica's tree to ``max_keys``, least recently sent and deepest first."""
        for keys in self._keys.values():
            over = len(keys) - self.max_keys
            if over <= 0:
                continue
            for key, _ in sorted(keys.items(), key=lambda item: item[1])[:over]:
                del keys[key]
