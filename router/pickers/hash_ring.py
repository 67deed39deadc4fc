"""vllm-router's ``consistent_hash``: the session id on a ring of every replica's virtual
nodes (``src/policies/consistent_hash.rs``). Each replica URL is laid on the ring at 160
points, ``fbi_hash("URL:i")``; a session goes to the first point at or after
``fbi_hash(session id)``, wrapping around. The ring spans every replica in the pool, routable
or not: when the owner cannot take the request it goes to the first routable replica, and
the owner takes its sessions back once it is routable again.

``fbi_hash`` is that router's hash (mcrouter's furc_hash over MurmurHash64A, expanded to 64
bits by MurmurHash64A again), written again here so the simulated ring places sessions
where the real one does.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from functools import lru_cache
from typing import Self

from router.inputs import Candidate, RouteContext
from router.knobs import Knobs
from router.parts import Picked

VIRTUAL_NODES_PER_REPLICA = 160
_M = 0xC6A4A7935BD1E995
_MASK = (1 << 64) - 1
_SEED = 4193360111
_FURC_SHIFT = 23
_FURC_MAX_TRIES = 32
_FURC_MODULUS = (1 << 23) - 1


def murmur_hash_64a(key: bytes, seed: int) -> int:
    """MurmurHash64A (mcrouter's lib/fbi/hash.c)."""
    h = (seed ^ (len(key) * _M)) & _MASK
    whole = len(key) - len(key) % 8
    for i in range(0, whole, 8):
        k = (int.from_bytes(key[i : i + 8], "little") * _M) & _MASK
        k ^= k >> 47
        k = (k * _M) & _MASK
        h = ((h ^ k) * _M) & _MASK
    rest = key[whole:]
    if rest:
        h ^= int.from_bytes(rest, "little")
        h = (h * _M) & _MASK
    h ^= h >> 47
    h = (h * _M) & _MASK
    h ^= h >> 47
    return h


def _murmur_rehash_64a(k: int) -> int:
    h = (_SEED ^ (8 * _M)) & _MASK
    k = (k * _M) & _MASK
    k ^= k >> 47
    k = (k * _M) & _MASK
    h = ((h ^ k) * _M) & _MASK
    h ^= h >> 47
    h = (h * _M) & _MASK
    h ^= h >> 47
    return h


def furc_hash(key: bytes, m: int) -> int:
    """mcrouter's furc_hash: a consistent hash of ``key`` into [0, m)."""
    if m <= 1:
        return 0
    cache: list[int] = []

    def bit(idx: int) -> bool:
        ord_ = idx >> 6
        while len(cache) <= ord_:
            n = len(cache)
            cache.append(murmur_hash_64a(key, _SEED) if n == 0 else _murmur_rehash_64a(cache[-1]))
        return bool((cache[ord_] >> (idx & 0x3F)) & 1)

    d = 0
    while m > (1 << d):
        d += 1
    a = d
    for _ in range(_FURC_MAX_TRIES):
        while not bit(a):
            if d == 0:
                return 0
            d -= 1
            a = d
        a += _FURC_SHIFT
        num = 1
        for _ in range(max(0, d - 1)):
            num = (num << 1) | int(bit(a))
            a += _FURC_SHIFT
        if num < m:
            return num
    return 0


@lru_cache(maxsize=65_536)
def fbi_hash(key: str) -> int:
    """vllm-router's ``ConsistentHashPolicy::fbi_hash``."""
    furc = furc_hash(key.encode(), _FURC_MODULUS)
    return murmur_hash_64a(furc.to_bytes(4, "little"), _SEED)


@lru_cache(maxsize=64)
def ring(replicas: frozenset[str]) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The ring's points in order and the replica owning each."""
    points = {
        fbi_hash(f"{url}:{i}"): url
        for url in sorted(replicas)
        for i in range(VIRTUAL_NODES_PER_REPLICA)
    }
    ordered = sorted(points)
    return tuple(ordered), tuple(points[p] for p in ordered)


def ring_owner(replicas: frozenset[str], key: str) -> str:
    """The replica owning ``key`` on the ring over ``replicas``."""
    points, owners = ring(replicas)
    i = bisect.bisect_left(points, fbi_hash(key))
    return owners[i % len(owners)]


class HashRingPicker:
    @classmethod
    def from_knobs(cls, knobs: Knobs) -> Self:
        return cls()

    def pick(
        self, ctx: RouteContext, candidates: Sequence[Candidate], scores: Sequence[float]
    ) -> Picked:
        everyone = ctx.replicas or frozenset(c.url for c in candidates)
        owner = ring_owner(everyone, ctx.session)
        for c in candidates:
            if c.url == owner:
                return Picked(c, turned=False)
        return Picked(candidates[0], turned=False)
