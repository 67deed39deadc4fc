"""vLLM's prefix-cache block hash, computed as vLLM 0.32 computes it with its default
``--prefix-caching-hash-algo sha256`` (``vllm.v1.core.kv_cache_utils.hash_block_tokens``
over ``vllm.utils.hashing.sha256``): SHA-256 of the pickled tuple
``(parent hash, block token ids, extra keys)``, chained from ``NONE_HASH`` (SHA-256 of the
pickled seed ``"vllm-none-hash"``, unless ``PYTHONHASHSEED`` is set on the replica). The
first block of a request with a ``cache_salt`` carries ``(("cache_salt", salt),)`` as its
extra keys, so the same tokens of two tenants hash apart.

The KV events (``router.kv_events``) carry these hashes; the gateway uses this to check
that a chain of stored blocks starts with its tenant's salt (``first_block_salted``) and
to name blocks it knows the tokens of.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Sequence
from typing import Any

NONE_HASH_SEED = "vllm-none-hash"


def _sha256(value: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def none_hash(seed: str = NONE_HASH_SEED) -> bytes:
    """The parent of a prefix's first block."""
    return _sha256(seed)


def salt_keys(cache_salt: str | None) -> tuple[tuple[str, str], ...] | None:
    """The first block's extra keys for a request salted with ``cache_salt``."""
    return (("cache_salt", cache_salt),) if cache_salt else None


def block_hash(
    parent: bytes | None,
    tokens: Sequence[int],
    extra_keys: tuple[Any, ...] | None = None,
    seed: str = NONE_HASH_SEED,
) -> bytes:
    """One full block's hash, after ``parent`` (None: the first block)."""
    return _sha256((parent or none_hash(seed), tuple(tokens), extra_keys))


def prefix_hashes(
    tokens: Sequence[int], block_size: int, cache_salt: str | None = None
) -> list[bytes]:
    """The hashes of every full block of a prompt, as the replica names them."""
    hashes: list[bytes] = []
    parent: bytes | None = None
    for start in range(0, len(tokens) - block_size + 1, block_size):
        extra = salt_keys(cache_salt) if start == 0 else None
        parent = block_hash(parent, tokens[start : start + block_size], extra)
        hashes.append(parent)
    return hashes
