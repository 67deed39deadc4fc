"""vllm-router's policies as the simulator models them: consistent_hash's ring,
sticky_least_loaded's session counts, cache_aware's thresholds and tree eviction."""

from __future__ import annotations

from collections import Counter

from router import Knobs, ReplicaPool, RouteHints, get_preset, make_policy
from router.pickers.hash_ring import fbi_hash, furc_hash, murmur_hash_64a, ring_owner
from router.prefix_tree import PrefixTrees
from router.scorers.approx_tree import ApproxTreeScorer
from tests.router.support import NoStore, static_pool

COST = get_preset("h200-qwen3.6-27b")  # block size 16


def urls(n: int) -> frozenset[str]:
    return frozenset(f"http://replica-{i}:8000" for i in range(n))


def test_furc_hash_gives_mcrouters_golden_values() -> None:
    """Values from mcrouter's own furc_hash test (lib/fbi/test, kGoldenValues), which
    vllm-router's fbi_hash ports: the simulated ring is the real one."""
    golden = [
        ("a", 16, 13),
        ("a", 1_000_000, 570_739),
        ("ab", 500, 429),
        ("abc", 7, 5),
        ("mcrouter:pool:regional:0001", 8_388_608, 6_119_431),
        ("user:12345:profile", 100_000, 96_279),
        ("", 5000, 3031),
        ("key0", 32, 22),
    ]
    assert [furc_hash(k.encode(), m) for k, m, _ in golden] == [e for _, _, e in golden]


def test_the_hash_is_deterministic_and_spread() -> None:
    assert fbi_hash("session-1") == fbi_hash("session-1")
    assert len({fbi_hash(f"session-{i}") for i in range(1000)}) == 1000
    # MurmurHash64A of one 8-byte block differs in its low and high bits from a neighbour's.
    assert murmur_hash_64a(b"abcdefgh", 0) != murmur_hash_64a(b"abcdefgi", 0)
    assert all(0 <= fbi_hash(f"k{i}") < 2**64 for i in range(100))


def test_consistent_hash_spreads_sessions_and_moves_few_when_a_replica_joins() -> None:
    sessions = [f"s{i}" for i in range(4000)]
    eight = {s: ring_owner(urls(8), s) for s in sessions}
    shares = Counter(eight.values())
    assert len(shares) == 8 and min(shares.values()) > 4000 / 8 * 0.6, shares
    nine = {s: ring_owner(urls(9), s) for s in sessions}
    moved = [s for s in sessions if nine[s] != eight[s]]
    # Only sessions the new replica takes move: about 1/9 of them, all to it.
    assert all(nine[s] == "http://replica-8:8000" for s in moved)
    assert 0.05 < len(moved) / len(sessions) < 0.2


async def test_consistent_hash_keeps_a_session_whatever_the_load_and_returns_it() -> None:
    pool = static_pool([0, 0, 0, 0])
    policy = make_policy("consistent_hash")
    first = {s: (await policy.choose("t", s, pool)).replica.url for s in ("a", "b", "c", "d")}
    for r in pool.replicas:  # load does not matter to the ring
        r.metrics = type(r.metrics)(running=50 if r.url == first["a"] else 0, waiting=0)
    assert (await policy.choose("t", "a", pool)).replica.url == first["a"]
    owner = pool.get(first["a"])
    assert owner is not None
    owner.healthy = False  # the owner is out: the first routable replica takes it
    fallback = (await policy.choose("t", "a", pool)).replica
    assert fallback is next(r for r in pool.replicas if r.healthy)
    owner.healthy = True  # and it goes back once its owner is routable again
    assert (await policy.choose("t", "a", pool)).replica.url == first["a"]


async def test_sticky_least_loaded_places_by_sessions_and_never_moves_one() -> None:
    pool = static_pool([0, 0, 0])
    policy = make_policy("sticky_least_loaded", assignments=NoStore())
    placed = {}
    for i in range(6):
        hints = RouteHints(assignment_read=True)
        placed[f"s{i}"] = (await policy.choose("t", f"s{i}", pool, hints=hints)).replica.url
    assert sorted(Counter(placed.values()).values()) == [2, 2, 2]
    busy = pool.get(placed["s0"])
    assert busy is not None
    busy.metrics = type(busy.metrics)(running=500, waiting=100)
    kept = RouteHints(assignment=placed["s0"], assignment_read=True)
    stays = await policy.choose("t", "s0", pool, hints=kept)
    assert (stays.replica, stays.reason) == (busy, "sticky")
    # A session that ended still counts (vllm-router is never told), so the seventh new
    # session goes by the counts of all six.
    seventh = await policy.choose("t", "s6", pool, hints=RouteHints(assignment_read=True))
    assert seventh.reason == "new"
    # The tie among three replicas with two sessions each is broken by the session's hash,
    # the same way every time.
    again = make_policy("sticky_least_loaded", assignments=NoStore())
    for i in range(6):
        hints = RouteHints(assignment=placed[f"s{i}"], assignment_read=True)
        await again.choose("t", f"s{i}", pool, hints=hints)
    repeat = await again.choose("t", "s6", pool, hints=RouteHints(assignment_read=True))
    assert repeat.replica is seventh.replica


def candidates(pool: ReplicaPool, in_flight: list[int]) -> None:
    for r, n in zip(pool.replicas, in_flight, strict=True):
        r.in_flight = n


async def test_cache_aware_follows_a_match_above_its_threshold_only() -> None:
    pool = static_pool([0, 0])
    policy = make_policy("cache_aware", cost=COST)
    chain = list(range(100))  # 100 blocks of 16 tokens
    first = await policy.choose("t", "a", pool, hints=RouteHints(1600, block_chain=chain))
    assert first.replica is pool.replicas[0]  # nothing matched: least loaded, the first
    other = pool.replicas[1]
    candidates(pool, [3, 0])  # the replica holding it is busier, within the balance
    longer = [*chain, *range(1000, 1100)]  # 50% of it matched, above 0.3
    follows = await policy.choose("t", "a", pool, hints=RouteHints(3200, block_chain=longer))
    assert follows.replica is first.replica
    mostly_new = [*chain[:20], *range(2000, 2080)]  # 20% matched, at most 0.3: least loaded
    low = await policy.choose("t", "b", pool, hints=RouteHints(1600, block_chain=mostly_new))
    assert low.replica is other


def test_cache_aware_balances_only_past_both_thresholds() -> None:
    scorer = ApproxTreeScorer.from_knobs(Knobs())
    assert (scorer.balance_abs_threshold, scorer.balance_rel_threshold) == (64, 1.5)
    assert scorer.cache_threshold == 0.3
    assert scorer.imbalanced([100, 10])  # 90 apart and 10x
    assert not scorer.imbalanced([60, 0])  # 10x but only 60 apart
    assert not scorer.imbalanced([200, 140])  # 60 apart... and 1.43x
    assert not scorer.imbalanced([300, 210])  # 90 apart but 1.43x
    assert scorer.imbalanced([300, 190])  # 110 apart and 1.58x


async def test_cache_aware_goes_to_the_least_loaded_when_imbalanced() -> None:
    pool = static_pool([0, 0])
    policy = make_policy("cache_aware", cost=COST)
    chain = list(range(50))
    await policy.choose("t", "a", pool, hints=RouteHints(800, block_chain=chain))
    candidates(pool, [100, 10])  # the matched replica 0 is far busier
    moved = await policy.choose("t", "a", pool, hints=RouteHints(800, block_chain=chain))
    assert moved.replica is pool.replicas[1]
    candidates(pool, [30, 10])  # within the balance again: the match wins
    # Both trees now hold the prompt; the first replica's match ties and comes first.
    back = await policy.choose("t", "a", pool, hints=RouteHints(800, block_chain=chain))
    assert back.replica is pool.replicas[0]


def test_the_tree_matches_prefixes_and_evicts_least_recent_deepest_first() -> None:
    trees = PrefixTrees(block_size=16, max_chars=10 * 16 * 4)  # 10 keys per replica
    trees.insert("r", [1, 2, 3, 4, 5, 6])
    trees.insert("r", [1, 2, 7, 8, 9, 10])  # shares 1, 2; refreshes them
    assert trees.matched("r", [1, 2, 3, 4, 99]) == 4 * 16
    assert trees.matched("r", [99, 1]) == 0  # a prompt starting elsewhere matches nothing
    assert trees.size("r") == 10
    trees.insert("r", [1, 2, 7, 11])
    trees.evict()
    assert trees.size("r") == 10
    # The oldest path's deepest key went first; its shared start stays.
    assert trees.matched("r", [1, 2, 3, 4, 5, 6]) == 5 * 16
    assert trees.matched("r", [1, 2, 7, 8, 9, 10]) == 6 * 16


async def test_cache_aware_trims_its_trees_every_eviction_interval() -> None:
    now = [0.0]
    pool = static_pool([0])
    max_tree = 20 * 16 * 4  # 20 keys
    policy = make_policy("cache_aware", cost=COST, clock=lambda: now[0], max_tree_size=max_tree)
    for i in range(5):
        chain = list(range(100 * i, 100 * i + 10))
        await policy.choose("t", f"s{i}", pool, hints=RouteHints(160, block_chain=chain))
    assert policy.trees.size(pool.replicas[0].url) == 50
    now[0] = 121.0  # past the 120 s interval: the next decision trims first
    await policy.choose("t", "s9", pool, hints=RouteHints(160, block_chain=[9999]))
    assert policy.trees.size(pool.replicas[0].url) == 21
