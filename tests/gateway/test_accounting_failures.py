"""Accounting runs after the reply, in the background: when it fails (the store stays
unreachable over every retry, or a bug) the failure is logged with the request id and
counted in ``foldgate_accounting_lost_total``; asyncio never reports an unretrieved task
exception."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest
from prometheus_client import REGISTRY

from gateway.accounting import RequestRecord
from gateway.fold.renderer import RenderStats
from gateway.fold.spec import parse_spec
from gateway.identity import Caller
from gateway.request_cache import Decoded
from gateway.steps import account
from gateway.steps.admit import Quotas
from gateway.steps.ingest import Ingested, Stored
from gateway.steps.restore import Outcome
from gateway.tenants import Tenants
from gateway.transcript import Message, Text, Transcript
from router.replica import Replica
from store import Lookup, open_store

# Nothing listens on the discard port: every call is refused, as during a Redis outage.
UNREACHABLE_REDIS = "redis://127.0.0.1:9/0"


def lost(reason: str) -> float:
    sample = REGISTRY.get_sample_value("foldgate_accounting_lost_total", {"reason": reason})
    return sample or 0.0


async def settle(running: set[asyncio.Task[None]], caplog: pytest.LogCaptureFixture) -> None:
    """Wait for the background tasks without retrieving their outcome (``asyncio.wait``
    does not), then drop them: an outcome nobody retrieved is logged by asyncio then."""
    await asyncio.wait(set(running))
    await asyncio.sleep(0)  # the tasks' done callbacks
    assert not running
    gc.collect()
    assert "exception was never retrieved" not in caplog.text


async def test_a_store_outage_over_every_retry_is_logged_with_the_request_id_and_counted(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(account, "RETRY_S", 0.0)
    store = open_store(UNREACHABLE_REDIS, timeout_s=1.0)
    ingested = Ingested(
        caller=Caller("t", parse_spec("base"), "auto", budget=None, max_bytes=None),
        session="s",
        decoded=Decoded.full(Transcript((Message("user", (Text("hello"),)),))),
        found=Lookup(None, 0, {}, {}, None),
        stream=False,
    )
    replica = Replica("http://127.0.0.1:9")
    outcome = Outcome(replica, ({"prompt_tokens": 2},), 0, RenderStats(), 0.0)
    request = RequestRecord.from_dict({"messages": 1, "strategy": "base", "replica": replica.url})
    before = lost("store_unavailable")
    running: set[asyncio.Task[None]] = set()
    try:
        with caplog.at_level(logging.WARNING):
            work = account.account(
                store,
                Quotas(store, Tenants({}, None)),
                ingested,
                Stored(branch=0, assignment=None),
                request,
                outcome,
                request_id="req-outage",
            )
            account.in_background(running, work, "req-outage")
            await settle(running, caplog)
    finally:
        await store.close()
    assert lost("store_unavailable") == before + 1
    assert f"accounting of request req-outage lost after {account.ATTEMPTS} attempts" in (
        caplog.text
    )


async def test_an_unexpected_accounting_error_is_logged_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def broken() -> None:
        raise RuntimeError("a bug in the accounting")

    before = lost("error")
    running: set[asyncio.Task[None]] = set()
    with caplog.at_level(logging.WARNING):
        account.in_background(running, broken(), "req-bug")
        await settle(running, caplog)
    assert lost("error") == before + 1
    assert "accounting of request req-bug failed" in caplog.text
    assert "a bug in the accounting" in caplog.text  # the traceback is in the log
