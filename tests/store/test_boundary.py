"""The contracts check their arguments once, before any backend hook runs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from store import Assign, Charge, HeldLease, LeaseClaim
from tests.store.conftest import history, msg
from tests.store.recording_store import RecordingStore

Call = Callable[[RecordingStore, str], Awaitable[Any]]

# Every public method of every contract, called with the given tenant and otherwise
# valid arguments.
CALLS: dict[str, Call] = {
    "ingest": lambda s, t: s.ingest(t, "s", history(2)),
    "lookup": lambda s, t: s.lookup(t, "s", history(2)),
    "load": lambda s, t: s.load(t, "s"),
    "append_gateway_turns": lambda s, t: s.append_gateway_turns(t, "s", 0, 0, [msg("user", "x")]),
    "list_sessions": lambda s, t: s.list_sessions(t),
    "session_page": lambda s, t: s.session_page(t, 10),
    "delete_session": lambda s, t: s.delete_session(t, "s"),
    "add_counts": lambda s, t: s.add_counts(t, "s", 0, {"requests": 1}, token="r1"),
    "get_log": lambda s, t: s.get_log(t, "s", 0),
    "get_counts": lambda s, t: s.get_counts(t, "s", 0),
    "get_tenant_counts": lambda s, t: s.get_tenant_counts(t),
    "charge": lambda s, t: s.charge(t, [Charge("req", 1, 3, 60.0)]),
    "charge with a lease": lambda s, t: s.charge(t, [], lease=LeaseClaim("slots", "l1", 2, 30.0)),
    "renew_leases": lambda s, t: s.renew_leases([HeldLease(t, "slots", "l1")], 30.0),
    "release_lease": lambda s, t: s.release_lease(HeldLease(t, "slots", "l1")),
    "get_assignment": lambda s, t: s.get_assignment(t, "s"),
    "set_assignment": lambda s, t: s.set_assignment(t, "s", "r1", expected=None, ttl_s=30),
    "put_reply": lambda s, t: s.put_reply(t, "resp_1", b"x"),
    "get_reply": lambda s, t: s.get_reply(t, "resp_1"),
}


@pytest.mark.parametrize("method", sorted(CALLS))
async def test_a_bad_tenant_never_reaches_the_backend(method: str) -> None:
    store = RecordingStore()
    for tenant in ("", "x" * 513, "a\x00b"):
        with pytest.raises(ValueError, match="tenant"):
            await CALLS[method](store, tenant)
    assert store.calls == []
    await CALLS[method](store, "t")
    assert len(store.calls) == 1  # a valid call reaches exactly one hook


async def test_bad_arguments_of_each_contract_are_refused_before_the_backend() -> None:
    store = RecordingStore()
    refusals: list[tuple[Awaitable[Any], str]] = [
        (store.ingest("t", "", history(1)), "session must be a non-empty string"),
        (store.ingest("t", "s", []), "empty history"),
        (store.ingest("t", "s", history(1), assign=Assign("r", None, 0)), "ttl_s must be positive"),
        (store.load("t", "s", -1), "branch id must be a non-negative int"),
        (store.append_gateway_turns("t", "s", 0, -1, [msg("user", "x")]), "after_index"),
        (store.append_gateway_turns("t", "s", 0, 0, []), "at least one message"),
        (store.add_counts("t", "s", True, {}, token="r"), "branch id"),  # type: ignore[arg-type]
        (store.add_counts("t", "s", 0, {"a:b": 1}, token="r"), "must not contain"),
        (store.add_counts("t", "s", 0, {}, token=""), "count token"),
        (store.get_log("t", "s", -1), "branch id"),
        (store.get_counts("t", "s", -1), "branch id"),
        (store.charge("t", [Charge("", 1)]), "charge must be a non-empty string"),
        (store.charge("t", [Charge("req", 1, 3, 0.0)]), "charge window must be positive"),
        (store.charge("t", [], session="", max_sessions=1), "session"),
        (store.charge("t", [], lease=LeaseClaim("", "l1", 2, 30.0)), "lease pool"),
        (store.charge("t", [], lease=LeaseClaim("slots", "", 2, 30.0)), "lease id"),
        (store.charge("t", [], lease=LeaseClaim("slots", "l1", 0, 30.0)), "lease limit"),
        (store.charge("t", [], lease=LeaseClaim("slots", "l1", 2, 0.0)), "period_s must be"),
        (store.renew_leases([HeldLease("t", "slots", "l1")], -1.0), "period_s must be"),
        (store.renew_leases([HeldLease("t", "slots", "a\x00b")], 30.0), "lease id"),
        (store.release_lease(HeldLease("t", "", "l1")), "lease pool"),
        (store.set_assignment("t", "s", "", expected=None, ttl_s=30), "replica"),
        (store.set_assignment("t", "s", "r1", expected=None, ttl_s=0), "ttl_s must be positive"),
        (store.put_reply("t", "", b"x"), "reply"),
        (store.get_reply("t", "a\x00b"), "reply"),
        (store.session_page("t", 0), "limit must be a positive int"),
        (store.session_page("t", True), "limit must be a positive int"),
        (store.session_page("t", 5, after="s"), "not a session cursor"),
        (store.session_page("t", 5, after="1.5:"), "session must be a non-empty string"),
    ]
    for call, message in refusals:
        with pytest.raises(ValueError, match=message):
            await call
    assert store.calls == []


async def test_hooks_get_the_history_packed_and_the_cap_resolved() -> None:
    store = RecordingStore(max_session_bytes=1000)
    h = history(3)
    await store.ingest("t", "s", h, max_bytes=400)
    await store.lookup("t", "s", h, max_bytes=10**9)
    (_, ingested), (_, looked_up) = store.calls
    assert [len(ingested[2].packed), ingested[3]] == [3, 400]
    assert looked_up[2].chains == ingested[2].chains and looked_up[3] == 1000
    assert ("t", "s") in store.digest_cache
    await store.delete_session("t", "s")
    assert ("t", "s") not in store.digest_cache  # forgotten before the backend drops it
