import pytest
from hypothesis import given
from hypothesis import strategies as st

from offline.prefix_cache import PrefixCache


def ids(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def test_first_request_misses_then_extension_hits_full_blocks() -> None:
    cache = PrefixCache(block_size=4)
    r1 = cache.request(ids(10))  # blocks [0-3], [4-7]; 8,9 partial, not cached
    assert (r1.cached_tokens, r1.uncached_tokens, r1.blocks_in_use) == (0, 10, 2)
    r2 = cache.request(ids(14))
    assert r2.cached_tokens == 8 and r2.uncached_tokens == 6
    assert r2.blocks_in_use == 3
    assert cache.hit_rate == pytest.approx(8 / 24)


def test_partial_block_never_cached() -> None:
    cache = PrefixCache(block_size=4)
    cache.request(ids(3))
    assert len(cache) == 0
    assert cache.request(ids(3)).cached_tokens == 0


def test_full_hit_recomputes_last_block_like_vllm() -> None:
    cache = PrefixCache(block_size=4)
    cache.request(ids(8))
    assert cache.request(ids(8)).cached_tokens == 4
    assert cache.request(ids(9)).cached_tokens == 8


def test_hashes_are_chained_so_a_changed_prefix_misses_later_blocks() -> None:
    cache = PrefixCache(block_size=4)
    cache.request(ids(12))
    changed = ids(12)
    changed[1] = 999  # first block differs, blocks 2-3 identical in content
    assert cache.request([*changed, 0]).cached_tokens == 0
    tail_changed = ids(12)
    tail_changed[9] = 999
    assert cache.request([*tail_changed, 0]).cached_tokens == 8


def test_same_block_content_at_another_position_is_a_different_block() -> None:
    cache = PrefixCache(block_size=2)
    cache.request([1, 2, 1, 2, 0])
    h = cache.block_hashes([1, 2, 1, 2])
    assert h[0] != h[1]


def test_lru_eviction_evicts_least_recent_session_first() -> None:
    cache = PrefixCache(block_size=4, capacity_blocks=4)
    a, b = ids(9, 0), ids(9, 100)
    cache.request(a)  # 2 blocks
    cache.request(b)  # 2 blocks, cache full
    cache.request(a)  # touch a: b is now least recent
    c = ids(9, 200)
    cache.request(c)  # evicts b's blocks
    assert cache.request(a).cached_tokens == 8
    assert cache.request(b).cached_tokens == 0


def test_evicting_a_parent_makes_descendants_unreachable() -> None:
    cache = PrefixCache(block_size=2, capacity_blocks=3)
    cache.request(ids(7))  # 3 blocks: root, mid, tail
    root = cache.block_hashes(ids(2))[0]
    # a new unrelated request of 1 block evicts the LRU block: the tail (touched first)
    cache.request([50, 51, 0])
    assert root in cache
    assert cache.request(ids(7)).cached_tokens == 4
    cache2 = PrefixCache(block_size=2, capacity_blocks=3)
    cache2.request(ids(7))
    cache2.evict(root)  # as if the root alone had become least recent
    assert len(cache2) == 2
    assert cache2.request(ids(7)).cached_tokens == 0  # children resident but unreachable


def test_request_larger_than_capacity_keeps_its_prefix() -> None:
    cache = PrefixCache(block_size=2, capacity_blocks=2)
    cache.request(ids(9))  # 4 blocks, only 2 fit: the leading ones stay
    assert len(cache) == 2
    assert cache.request(ids(9)).cached_tokens == 4


def test_bad_parameters() -> None:
    with pytest.raises(ValueError, match="block_size"):
        PrefixCache(block_size=0)
    with pytest.raises(ValueError, match="capacity_blocks"):
        PrefixCache(capacity_blocks=0)


@given(
    st.lists(st.lists(st.integers(0, 3), max_size=40), min_size=1, max_size=6),
    st.integers(1, 5),
)
def test_incremental_hashing_matches_fresh_hashing(prompts: list[list[int]], bs: int) -> None:
    cache = PrefixCache(block_size=bs)
    for p in prompts:
        got = cache.block_hashes(p)
        assert got == PrefixCache(block_size=bs).block_hashes(p)
        assert len(got) == len(p) // bs
