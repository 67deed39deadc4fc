"""The histories contract (store.histories), run against every backend (real Redis, SQLite)."""

from __future__ import annotations

import asyncio
import os
import random
import string

import pytest

from store import Assign, NotFound, SessionStore, SessionTooLarge
from tests.store.conftest import StoreFactory, history, msg


async def test_identical_resend_appends_nothing(store: SessionStore, tenant: str) -> None:
    h = history(6)
    first = await store.ingest(tenant, "s", h)
    again = await store.ingest(tenant, "s", [dict(m) for m in h])
    assert (first.branch_id, first.step_count, first.appended, first.new_branch) == (0, 6, 6, True)
    assert (again.branch_id, again.step_count, again.appended, again.new_branch) == (0, 6, 0, False)
    assert list((await store.load(tenant, "s")).messages) == h


async def test_extension_appends_only_the_suffix(store: SessionStore, tenant: str) -> None:
    h = history(10)
    await store.ingest(tenant, "s", h[:4])
    r = await store.ingest(tenant, "s", h)
    assert (r.branch_id, r.step_count, r.appended, r.first_new, r.new_branch) == (
        0,
        10,
        6,
        4,
        False,
    )
    loaded = await store.load(tenant, "s", 0)
    assert list(loaded.messages) == h
    assert (loaded.parent, loaded.fork_index) == (None, 0)


async def test_editing_sent_dicts_in_place_is_seen(store: SessionStore, tenant: str) -> None:
    h = history(4)
    await store.ingest(tenant, "s", h)
    h[2]["parts"][0]["text"] = "edited in place"  # a harness that mutates its own history
    r = await store.ingest(tenant, "s", h)
    assert (r.branch_id, r.new_branch, r.appended) == (1, True, 2)
    assert (await store.load(tenant, "s", 1)).messages[2]["parts"][0]["text"] == "edited in place"


async def test_extension_by_a_fresh_process(make_store: StoreFactory, tenant: str) -> None:
    # a second replica has no digest memory of the session: the backend alone decides
    a, b = make_store(), make_store()
    try:
        h = history(8)
        await a.ingest(tenant, "s", h[:5])
        r = await b.ingest(tenant, "s", h)
        assert (r.branch_id, r.appended) == (0, 3)
        assert (await b.ingest(tenant, "s", h)).appended == 0
        assert list((await a.load(tenant, "s")).messages) == h
    finally:
        await a.close()
        await b.close()


async def test_divergence_forks_and_keeps_both_branches(store: SessionStore, tenant: str) -> None:
    h = history(8)
    await store.ingest(tenant, "s", h)
    edited = [*h[:5], msg("user", "compacted summary"), msg("assistant", "ok")]
    r = await store.ingest(tenant, "s", edited)
    assert (r.branch_id, r.step_count, r.appended, r.new_branch) == (1, 7, 2, True)
    fork = await store.load(tenant, "s", 1)
    assert list(fork.messages) == edited
    assert (fork.parent, fork.fork_index) == (0, 5)
    assert list((await store.load(tenant, "s", 0)).messages) == h
    # the head is the branch most recently ingested into
    assert (await store.load(tenant, "s")).branch_id == 1
    # extending the old branch again goes back to it
    r0 = await store.ingest(tenant, "s", [*h, msg("user", "more")])
    assert (r0.branch_id, r0.appended, r0.new_branch) == (0, 1, False)


async def test_fork_of_a_fork_shares_prefix(store: SessionStore, tenant: str) -> None:
    h = history(6)
    await store.ingest(tenant, "s", h)
    b1 = [*h[:4], *history(4, "b1 ")]
    await store.ingest(tenant, "s", b1)
    b2 = [*b1[:6], msg("user", "b2")]
    r = await store.ingest(tenant, "s", b2)
    assert (r.branch_id, r.appended) == (2, 1)
    loaded = await store.load(tenant, "s", 2)
    assert list(loaded.messages) == b2
    assert (loaded.parent, loaded.fork_index) == (1, 6)
    # a fork taken inside an ancestor's inherited prefix
    b3 = [*h[:2], msg("user", "b3")]
    r3 = await store.ingest(tenant, "s", b3)
    assert list((await store.load(tenant, "s", r3.branch_id)).messages) == b3


async def test_shorter_resend_is_a_noop_on_the_branch_holding_it(
    store: SessionStore, tenant: str
) -> None:
    h = history(6)
    await store.ingest(tenant, "s", h)
    await store.ingest(tenant, "s", [*h[:2], msg("user", "other")])  # branch 1, now head
    r = await store.ingest(tenant, "s", h[:3])  # a late or retried earlier request
    assert (r.branch_id, r.step_count, r.appended, r.new_branch) == (0, 3, 0, False)
    assert (await store.load(tenant, "s")).branch_id == 0
    # continuing from there differently forks at the first new message
    r2 = await store.ingest(tenant, "s", [*h[:3], msg("assistant", "changed")])
    assert (r2.branch_id, r2.new_branch) == (2, True)
    assert (await store.load(tenant, "s", 2)).fork_index == 3


async def test_longest_matching_branch_wins(store: SessionStore, tenant: str) -> None:
    h = history(10)
    await store.ingest(tenant, "s", h[:3])
    await store.ingest(tenant, "s", [*h[:2], msg("user", "other")])  # branch 1, now head
    r = await store.ingest(tenant, "s", h[:7])
    assert (r.branch_id, r.appended) == (0, 4)


async def test_gateway_turns_kept_beside_history(store: SessionStore, tenant: str) -> None:
    h = history(6)
    await store.ingest(tenant, "s", h)
    restore = [msg("assistant", "restore 2"), msg("user", "the original output " * 100)]
    await store.append_gateway_turns(tenant, "s", 0, 5, restore)
    await store.append_gateway_turns(tenant, "s", 0, 5, [msg("assistant", "second")])
    await store.append_gateway_turns(tenant, "s", 0, 1, [msg("assistant", "early")])
    loaded = await store.load(tenant, "s", 0)
    assert list(loaded.messages) == h
    assert {k: list(v) for k, v in loaded.gateway_turns.items()} == {
        1: [msg("assistant", "early")],
        5: [*restore, msg("assistant", "second")],
    }
    # the harness history still matches: a re-send is a no-op, an extension appends
    assert (await store.ingest(tenant, "s", h)).appended == 0
    assert (await store.ingest(tenant, "s", [*h, msg("assistant", "next")])).appended == 1
    # a fork inherits the turns that follow a message of the shared prefix only
    r = await store.ingest(tenant, "s", [*h[:3], msg("user", "fork")])
    fork = await store.load(tenant, "s", r.branch_id)
    assert {k: list(v) for k, v in fork.gateway_turns.items()} == {1: [msg("assistant", "early")]}
    # the gateway's per-request read: the turns without the history it already holds
    light = await store.load(tenant, "s", r.branch_id, messages=False)
    assert light.messages == ()
    assert light.gateway_turns == fork.gateway_turns


async def test_lookup_reads_what_ingest_would_find(make_store: StoreFactory, tenant: str) -> None:
    a, b = make_store(), make_store()
    try:
        h = history(6)
        empty = await a.lookup(tenant, "s", h)
        assert (empty.branch, empty.stored, dict(empty.gateway_turns), empty.assignment) == (
            None,
            0,
            {},
            None,
        )
        assert await a.list_sessions(tenant) == []  # a lookup writes nothing
        await a.ingest(tenant, "s", h)
        restore = [msg("assistant", "restore 2"), msg("user", "the original output " * 100)]
        await a.append_gateway_turns(tenant, "s", 0, 5, restore)
        await a.append_gateway_turns(tenant, "s", 0, 1, [msg("assistant", "early")])
        await a.add_counts(tenant, "s", 0, {"requests": 1}, token="r1", latest={"last": 9})
        await a.set_assignment(tenant, "s", "r1", expected=None, ttl_s=30)
        longer = [*h, msg("assistant", "next")]
        for store in (a, b):  # b: a fresh process, no digest memory
            found = await store.lookup(tenant, "s", longer)
            assert (found.branch, found.stored, found.assignment) == (0, 6, "r1")
            assert dict(found.counts) == {"requests": 1, "last": 9}
            assert {k: list(v) for k, v in found.gateway_turns.items()} == {
                1: [msg("assistant", "early")],
                5: restore,
            }
        # a shorter re-send sees only the turns inside it; a fork inherits the shared ones
        short = await b.lookup(tenant, "s", h[:4])
        assert (short.branch, short.stored) == (0, 4)
        assert {k: list(v) for k, v in short.gateway_turns.items()} == {
            1: [msg("assistant", "early")]
        }
        fork = [*h[:3], msg("user", "fork")]
        forked = await b.lookup(tenant, "s", fork)
        assert (forked.branch, forked.stored, dict(forked.counts)) == (None, 3, {})
        assert {k: list(v) for k, v in forked.gateway_turns.items()} == {
            1: [msg("assistant", "early")]
        }
        # and ingest then lands where lookup said, appending only the unstored part
        r = await b.ingest(tenant, "s", longer)
        assert (r.branch_id, r.appended) == (0, 1)
        assert list((await a.load(tenant, "s")).messages) == longer
    finally:
        await a.close()
        await b.close()


async def test_ingest_sets_the_assignment_in_the_same_write(
    make_store: StoreFactory, tenant: str
) -> None:
    a = make_store(max_session_bytes=4096)
    try:
        h = history(4)
        r = await a.ingest(tenant, "s", h, assign=Assign("r1", expected=None, ttl_s=30))
        assert (r.branch_id, r.appended, r.assignment) == (0, 4, "r1")
        assert await a.list_sessions(tenant) == ["s"]
        # compare-and-set as set_assignment: a stale expectation loses to the value in force
        again = await a.ingest(tenant, "s", h, assign=Assign("r2", expected="r3", ttl_s=30))
        assert (again.appended, again.assignment) == (0, "r1")
        moved = await a.ingest(tenant, "s", h, assign=Assign("r2", expected="r1", ttl_s=30))
        assert moved.assignment == "r2"
        assert (await a.ingest(tenant, "s", h)).assignment is None  # not asked
        assert await a.get_assignment(tenant, "s") == "r2"
        # a refused ingest writes no assignment either
        with pytest.raises(SessionTooLarge):
            await a.ingest(
                tenant, "big", [msg("user", os.urandom(4000).hex())], assign=Assign("r1", None, 30)
            )
        assert await a.get_assignment(tenant, "big") is None
        assert await a.list_sessions(tenant) == ["s"]
    finally:
        await a.close()


async def test_gateway_turn_errors(store: SessionStore, tenant: str) -> None:
    await store.ingest(tenant, "s", history(3))
    with pytest.raises(ValueError, match="after_index 3 is outside branch 0"):
        await store.append_gateway_turns(tenant, "s", 0, 3, [msg("assistant", "x")])
    with pytest.raises(NotFound, match="no branch 7"):
        await store.append_gateway_turns(tenant, "s", 7, 0, [msg("assistant", "x")])
    with pytest.raises(ValueError, match="at least one message"):
        await store.append_gateway_turns(tenant, "s", 0, 0, [])


async def test_listing_and_deletion(store: SessionStore, tenant: str) -> None:
    await store.ingest(tenant, "a", history(2))
    await store.ingest(tenant, "b", history(2))
    await store.ingest(f"{tenant}-other", "c", history(2))
    assert sorted(await store.list_sessions(tenant)) == ["a", "b"]
    await store.set_assignment(tenant, "a", "r1", expected=None, ttl_s=30)
    assert await store.delete_session(tenant, "a") is True
    assert await store.delete_session(tenant, "a") is False
    assert await store.list_sessions(tenant) == ["b"]
    assert await store.get_assignment(tenant, "a") is None
    with pytest.raises(NotFound, match="no session 'a'"):
        await store.load(tenant, "a")
    # a deleted session starts over from scratch
    r = await store.ingest(tenant, "a", history(3))
    assert (r.branch_id, r.appended) == (0, 3)


async def test_sessions_are_listed_in_pages_by_last_use(store: SessionStore, tenant: str) -> None:
    names = [f"s{i}" for i in range(7)]
    for name in names:
        await store.ingest(tenant, name, history(2))
    await store.load(tenant, "s2")  # used again: now the most recent
    newest_first = ["s2", *(n for n in reversed(names) if n != "s2")]
    pages, after = [], None
    while True:
        page = await store.session_page(tenant, 3, after)
        pages.append(page.sessions)
        for name in page.sessions:  # reading them uses them: the cursor still holds
            await store.load(tenant, name)
        if page.next is None:
            break
        after = page.next
    assert pages == [newest_first[:3], newest_first[3:6], newest_first[6:]]
    whole = await store.session_page(tenant, 7)
    assert whole.next is None and len(whole.sessions) == 7


async def test_ttl_expires_unused_sessions(make_store: StoreFactory, tenant: str) -> None:
    s = make_store(ttl_s=0.6)
    try:
        await s.ingest(tenant, "idle", history(2))
        await s.ingest(tenant, "busy", history(2))
        for _ in range(5):  # use refreshes the TTL
            await asyncio.sleep(0.2)
            await s.load(tenant, "busy")
        assert await s.list_sessions(tenant) == ["busy"]
        with pytest.raises(NotFound):
            await s.load(tenant, "idle")
    finally:
        await s.close()


async def test_size_cap_rejects_without_writing(make_store: StoreFactory, tenant: str) -> None:
    s = make_store(max_session_bytes=4000)
    try:
        h = history(4)
        await s.ingest(tenant, "s", h)
        big = msg("tool", "".join(random.choices(string.ascii_letters, k=8000)), tool_call_id="1")
        with pytest.raises(SessionTooLarge, match=r"over the 4000-byte cap"):
            await s.ingest(tenant, "s", [*h, big])
        with pytest.raises(SessionTooLarge):
            await s.append_gateway_turns(tenant, "s", 0, 3, [big])
        loaded = await s.load(tenant, "s")
        assert (list(loaded.messages), dict(loaded.gateway_turns)) == (h, {})
        # a caller's smaller cap (a tenant's limit) holds the same way; a larger one does not
        # lift the store's
        with pytest.raises(SessionTooLarge, match=r"over the 300-byte cap"):
            await s.ingest(tenant, "small", history(12), max_bytes=300)
        with pytest.raises(NotFound):
            await s.load(tenant, "small")
        with pytest.raises(SessionTooLarge, match=r"over the 4000-byte cap"):
            await s.ingest(tenant, "s", [*h, big], max_bytes=10**9)
    finally:
        await s.close()


async def test_lookup_refuses_what_ingest_would_refuse_as_too_large(
    make_store: StoreFactory, tenant: str
) -> None:
    """So a gateway refuses an over-cap request before any upstream serves it."""
    s = make_store(max_session_bytes=4000)
    try:
        h = history(4)
        await s.ingest(tenant, "s", h)
        big = msg("tool", "".join(random.choices(string.ascii_letters, k=8000)), tool_call_id="1")
        with pytest.raises(SessionTooLarge, match=r"over the 4000-byte cap"):
            await s.lookup(tenant, "s", [*h, big])
        with pytest.raises(SessionTooLarge, match=r"over the 300-byte cap"):
            await s.lookup(tenant, "new", history(12), max_bytes=300)
        assert await s.list_sessions(tenant) == ["s"]  # the refusals wrote nothing
        assert (await s.lookup(tenant, "s", h[:2], max_bytes=10)).stored == 2  # adds nothing

        # Near the cap the count is exact: a blob the session holds costs nothing again.
        text = "".join(random.choices(string.ascii_letters, k=3000))  # ~2.2 KB compressed
        read = [msg("user", "read"), msg("assistant", "call"), msg("tool", text, tool_call_id="a")]
        await s.ingest(tenant, "blob", read, max_bytes=3000)
        again = [*read, msg("assistant", "call"), msg("tool", text, tool_call_id="b")]
        assert (await s.lookup(tenant, "blob", again, max_bytes=3000)).stored == 3
        other = "".join(random.choices(string.ascii_letters, k=3000))
        with pytest.raises(SessionTooLarge, match=r"over the 3000-byte cap"):
            await s.lookup(
                tenant, "blob", [*read, msg("tool", other, tool_call_id="b")], max_bytes=3000
            )
        assert (await s.ingest(tenant, "blob", again, max_bytes=3000)).appended == 2
    finally:
        await s.close()


async def test_repeated_large_body_stored_once(store: SessionStore, tenant: str) -> None:
    body = os.urandom(15000).hex()

    def reads(n: int) -> list[dict]:
        h = [msg("user", "read the file")]
        for i in range(n):
            h += [msg("assistant", f"read {i}"), msg("tool", body, tool_call_id=f"c{i}")]
        return h

    await store.ingest(tenant, "once", reads(1))
    await store.ingest(tenant, "ten", reads(10))
    assert list((await store.load(tenant, "ten")).messages) == reads(10)
    once = await store.stored_bytes(tenant, "once")  # type: ignore[attr-defined]
    ten = await store.stored_bytes(tenant, "ten")  # type: ignore[attr-defined]
    assert once > len(body) // 2  # hex compresses to about half
    assert ten - once < len(body) // 4  # 18 more small messages, not one more copy of the body


async def test_messages_round_trip_exactly(store: SessionStore, tenant: str) -> None:
    h = [
        {"role": "system", "parts": [{"type": "text", "text": "sys", "meta": {"cache": True}}]},
        {
            "role": "assistant",
            "parts": [
                {"type": "thinking", "text": "hmm " * 400, "signature": "sig=="},
                {"type": "tool_call", "id": "c1", "name": "bash", "arguments": '{"cmd": "ls"}'},
            ],
            "meta": {"unknown": [1, 2.5, None, {"nested": "x" * 2000}]},
        },
        {"role": "tool", "parts": [], "tool_call_id": "c1", "is_error": True},
        {"role": "user", "parts": [{"type": "opaque", "data": {"image": "ü" * 600}}]},
    ]
    await store.ingest(tenant, "s", h)
    assert list((await store.load(tenant, "s")).messages) == h


async def test_bad_input_is_named(store: SessionStore, tenant: str) -> None:
    with pytest.raises(ValueError, match="empty history"):
        await store.ingest(tenant, "s", [])
    with pytest.raises(TypeError, match="must be a dict"):
        await store.ingest(tenant, "s", ["just text"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="tenant must be a non-empty string"):
        await store.ingest("", "s", history(1))
    with pytest.raises(ValueError, match="branch id must be a non-negative int"):
        await store.load(tenant, "s", -1)
    with pytest.raises(TypeError, match="string keys"):
        await store.ingest(tenant, "s", [{"role": "user", 1: "x"}])


async def test_ids_with_separators_do_not_collide(store: SessionStore, tenant: str) -> None:
    await store.ingest(f"{tenant}/a", "b", history(1, "one "))
    await store.ingest(tenant, "a/b", history(2, "two "))
    await store.ingest(tenant, "{x}", history(3, "three "))
    assert len((await store.load(f"{tenant}/a", "b")).messages) == 1
    assert len((await store.load(tenant, "a/b")).messages) == 2
    assert len((await store.load(tenant, "{x}")).messages) == 3


async def test_64_concurrent_ingests_stay_consistent(make_store: StoreFactory, tenant: str) -> None:
    # Two gateway replicas on the same data. What this checks is consistency, not speed: the
    # 64 calls open their connections and queue at once, and on a slow CI moment the last
    # one waited past the serving default of 2 s (a clean-clone run, 2026-12-01).
    replicas = [make_store(timeout_s=30), make_store(timeout_s=30)]
    try:
        base = history(10)
        ext = history(6, "ext ")
        await replicas[0].ingest(tenant, "s", base)
        requests = (
            [base] * 20
            + [base + ext[:k] for k in range(1, 7)] * 3
            + [[*base[:5], msg("user", f"retry {i}")] for i in range(26)]
        )
        random.Random(7).shuffle(requests)
        results = await asyncio.gather(
            *(replicas[i % 2].ingest(tenant, "s", r) for i, r in enumerate(requests))
        )
        for sent, res in zip(requests, results, strict=True):
            assert res.step_count == len(sent)
            stored = (await replicas[0].load(tenant, "s", res.branch_id)).messages
            assert list(stored[: len(sent)]) == sent  # no lost turn, none duplicated
        assert list((await replicas[1].load(tenant, "s", 0)).messages) == base + ext
        branches = {r.branch_id for r in results}
        assert branches == set(range(27))  # branch 0 plus one fork per distinct retry
        # late, shorter extensions land on branch 0 too: the history has no gaps or copies
        assert sum(r.appended for r in results) == len(ext) + 26
        with pytest.raises(NotFound):
            await replicas[0].load(tenant, "s", 27)
    finally:
        for r in replicas:
            await r.close()


async def test_shared_dicts_store_what_copies_store(store: SessionStore, tenant: str) -> None:
    # ``shared``: the gateway's dicts, never edited, reused from request to request; the
    # digest cache keeps them and knows them by identity: the results are a copy's.
    h = history(12)
    fork = [*h[:5], msg("user", "a fork")]
    sends = [h[:3], h[:3], h[:7], h, fork, h[:9], [dict(m) for m in h], h[:2]]
    for sent in sends:
        copy = [dict(m) for m in sent]
        found = await store.lookup(tenant, "shared", sent, shared=True)
        assert found == await store.lookup(tenant, "copied", copy)
        a = await store.ingest(tenant, "shared", sent, shared=True)
        assert a == await store.ingest(tenant, "copied", copy)
    for branch in (0, 1):
        a, b = (
            await store.load(tenant, "shared", branch),
            await store.load(tenant, "copied", branch),
        )
        assert (a.messages, a.gateway_turns, a.parent, a.fork_index) == (
            b.messages,
            b.gateway_turns,
            b.parent,
            b.fork_index,
        )
