"""DigestCache: bounded by the bytes it remembers, and exact whatever it forgets."""

from __future__ import annotations

from store.digests import DigestCache


def history(n: int, size: int, tag: str = "") -> list[dict]:
    return [
        {"role": "tool", "parts": [{"type": "text", "text": f"{tag}{i} " + "x" * size}]}
        for i in range(n)
    ]


def test_the_cache_stays_within_its_bytes_dropping_the_least_recently_used() -> None:
    evictions: list[int] = []
    sizes: list[int] = []
    cache = DigestCache(max_bytes=70_000, on_evict=evictions.append, on_size=sizes.append)
    for name in ("a", "b", "c"):
        cache.prepare("t", name, history(4, 5_000, name))  # ~22 KB each
    assert 60_000 < cache.bytes <= 70_000 and not evictions
    cache.prepare("t", "a", history(4, 5_000, "a"))  # "a" is now the most recent
    cache.prepare("t", "d", history(4, 5_000, "d"))
    assert len(evictions) == 1 and cache.bytes <= 70_000
    assert 20_000 < evictions[0] < 25_000  # the dropped session's size, for a metric
    assert sizes[-1] == cache.bytes
    # "b" went: its next request packs everything again; "a" is still known.
    assert cache.prepare("t", "a", history(4, 5_000, "a")).chains
    assert ("t", "b") not in cache and ("t", "a") in cache


def test_a_session_larger_than_the_bound_is_not_kept_and_digests_stay_exact() -> None:
    cache = DigestCache(max_bytes=10_000)
    big = history(8, 4_000)
    first = cache.prepare("t", "s", big)
    assert cache.bytes == 0
    assert cache.prepare("t", "s", big).chains == first.chains
    assert DigestCache().prepare("t", "s", big).chains == first.chains


def test_growth_and_forks_are_counted_as_held() -> None:
    cache = DigestCache()
    h = history(6, 2_000)
    cache.prepare("t", "s", h[:4])
    four = cache.bytes
    cache.prepare("t", "s", h)
    assert cache.bytes > four
    forked = [*h[:2], {"role": "user", "parts": [{"type": "text", "text": "other"}]}]
    fork = cache.prepare("t", "s", forked)
    assert fork.chains[:2] == DigestCache().prepare("t", "s", h[:2]).chains
    assert cache.bytes < four
    cache.forget("t", "s")
    assert cache.bytes == 0


def test_a_message_equal_only_by_python_equality_gets_its_own_digest() -> None:
    """``0 == 0.0`` in Python, not in the store's encoding: the second history's digest is
    its own, not the first's taken over."""
    cache = DigestCache()
    cache.prepare("t", "s", [{"role": "user", "meta": {"n": 0.0}}])
    second = [{"role": "user", "meta": {"n": 0}}]
    assert cache.prepare("t", "s", second).chains == DigestCache().prepare("t", "s", second).chains
