"""One replica's CPU KV offload tier, as vLLM's ``OffloadingConnector`` keeps it.

vLLM 0.32.0 with ``--kv-offloading-size GIB`` (``config/vllm.py``: the native backend,
``cpu_bytes_to_use`` = GIB x 2**30) runs ``CPUOffloadingManager``
(``v1/kv_offload/cpu/manager.py``) with its default ``LRUCachePolicy``
(``v1/kv_offload/cpu/policies/lru.py``): ``cpu_bytes_to_use`` divided into chunks of one GPU
block each (``blocks_per_chunk`` 1 unless configured, ``v1/kv_offload/cpu/spec.py``),
named by the block's hash. A store of chunks not yet held takes free chunks, else evicts
the least recently used ones that no load is reading, never one of the chunks offered in
the same store; when too few can be evicted the whole store is skipped. Recency is set
when a chunk is stored and again when the request that stored, reused or loaded it
finishes, its prompt's first chunk the most recent (``on_request_finished``). A chunk a
load is reading cannot be evicted until the load completes.

The tier is a :class:`~offline.prefix_cache.BlockPool` of the same dense block ids as the
GPU pool, with no request ever holding blocks except the loads reading them: a store
holds its chunks for the instant of the allocation (so none of them is evicted to make
room for another) and releases them at once. It evicts in the pool's batches.
"""

from __future__ import annotations

import numpy as np

from offline.prefix_cache import BlockPool


class OffloadTier:
    """A replica's CPU offload tier of ``capacity_blocks`` GPU-sized blocks."""

    def __init__(self, capacity_blocks: int) -> None:
        self.pool = BlockPool(capacity_blocks)
        self.stores_skipped = 0  # stores refused: too many chunks read by loads

    def ensure(self, n_ids: int) -> None:
        """Grow the id space with the GPU pool's."""
        self.pool.ensure(n_ids)

    def hits(self, ids: np.ndarray) -> int:
        """How many leading blocks of ``ids`` the tier holds (the connector's lookup)."""
        return self.pool.hits(ids, len(ids))

    def store(self, ids: np.ndarray) -> bool:
        """Offer computed blocks: those held are reused, the others stored, evicting the
        least recently used. False, with nothing stored, when loads pin too much of the
        tier to make room (vLLM skips the store and offers the blocks again next step)."""
        if not self.pool.acquire(ids):
            self.stores_skipped += 1
            return False
        self.pool.release(ids)
        return True

    def pin(self, ids: np.ndarray) -> None:
        """A load starts reading these held blocks: they cannot be evicted until it ends."""
        held = self.pool.acquire(ids)
        assert held, "pinning blocks the tier holds needs no room"

    def unpin(self, ids: np.ndarray) -> None:
        """The load reading these blocks completed."""
        self.pool.release(ids)

    def touch(self, ids: np.ndarray) -> None:
        """A request that stored, reused or loaded these blocks finished: most recently
        used, its first block most of all."""
        self.pool.touch(ids)
