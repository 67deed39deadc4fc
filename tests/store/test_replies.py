"""The kept-replies contract (store.replies), run against every backend (real Redis, SQLite)."""

from __future__ import annotations

import pytest

from store import SessionStore


async def test_kept_replies_are_per_tenant(store: SessionStore, tenant: str) -> None:
    assert await store.get_reply(tenant, "resp_1") is None
    await store.put_reply(tenant, "resp_1", b"\x00record")
    await store.put_reply(tenant, "resp_1", b"\x00record, again")  # a repeated put replaces
    assert await store.get_reply(tenant, "resp_1") == b"\x00record, again"
    assert await store.get_reply(f"{tenant}-other", "resp_1") is None
    with pytest.raises(ValueError, match="reply"):
        await store.put_reply(tenant, "", b"x")
