"""Account: one request counted in its branch's and tenant's counters, and logged.

Written after the reply (the client does not wait) in one store round trip (``add_counts``),
retried on a store outage under the request's id as its token, so a retry after a lost
reply counts nothing twice while concurrent identical requests each count. It runs as a
background task (``in_background``) whose failure is logged with the request id and
counted, never left unretrieved. What a record holds: ``gateway.accounting``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Coroutine
from typing import Any

import orjson

from gateway import metrics
from gateway.accounting import SUMMED, RequestRecord, as_dict, tool_names
from gateway.steps.admit import Quotas
from gateway.steps.forward import Opened
from gateway.steps.ingest import Ingested, Stored
from gateway.steps.restore import Outcome
from store import SessionStore, StoreUnavailable

log = logging.getLogger("foldgate")

ATTEMPTS = 3
RETRY_S = 0.5  # the first wait before retrying a write the store refused; doubles after


def record(
    ingested: Ingested,
    opened: Opened,
    outcome: Outcome,
    *,
    admission_wait_s: float = 0.0,
    priority: int = 0,
) -> RequestRecord:
    """The request's log record: what it sent, what the strategy did, what the replica
    reported (summed over restore attempts), how long it waited for admission and the
    priority it was sent with."""
    usage = outcome.usage
    stats = outcome.stats
    return RequestRecord(
        messages=len(ingested.transcript.messages),
        strategy=str(ingested.caller.strategy),  # the spec as text (opaque here)
        fold=ingested.caller.fold,
        pressure=outcome.pressure,
        tools=tool_names(ingested.transcript.tools),
        replica=outcome.replica.url,
        raw_tokens=ingested.raw_tokens,
        rendered_tokens=opened.tokens,
        upstream_prompt_tokens=sum(u.get("prompt_tokens", 0) for u in usage),
        upstream_cached_tokens=sum(
            (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0 for u in usage
        ),
        rendered_tokens_added=stats.overhead_tokens,
        rendered_tokens_removed_by_stubs=stats.stub_saved_tokens,
        rendered_tokens_removed_by_folds=stats.fold_saved_tokens,
        stubs=stats.stubs,
        folds=stats.folded_steps,
        rewrites=stats.rewrites,
        compactions=stats.compactions,
        restores=outcome.restores,
        overflow_retries=opened.overflow_retries,
        at=time.time(),
        admission_wait_s=admission_wait_s,
        priority=priority,
    )


async def account(
    store: SessionStore,
    quotas: Quotas,
    ingested: Ingested,
    stored: Stored,
    request: RequestRecord,
    outcome: Outcome,
    *,
    request_id: str,
) -> None:
    """Count ``request`` in its branch's and tenant's counters and log it; the store's
    ``StoreUnavailable`` when every attempt failed."""
    metrics.UPSTREAM_PROMPT_TOKENS.inc(request.upstream_prompt_tokens)
    metrics.UPSTREAM_CACHED_TOKENS.inc(request.upstream_cached_tokens)
    counts = {name: getattr(request, name) for name in SUMMED if name != "requests"}
    counts["requests"] = 1
    # What the replica holds of this session now, its last prompt: the cached-prefix
    # estimate routing prices the session's next move with.
    usage = outcome.usage
    latest = {"last_prompt_tokens": int(usage[-1].get("prompt_tokens", 0))} if usage else None
    for attempt in range(ATTEMPTS):
        try:
            await store.add_counts(
                ingested.tenant,
                ingested.session,
                stored.branch,
                counts,
                # The request's own token: a write retried after a lost reply adds nothing,
                # while concurrent identical requests each add theirs.
                token=request_id,
                latest=latest,
                record=orjson.dumps(as_dict(request)),
            )
            await quotas.record_upstream(ingested.tenant, request.upstream_prompt_tokens)
            return
        except StoreUnavailable:
            if attempt + 1 == ATTEMPTS:
                raise
            await asyncio.sleep(RETRY_S * 2**attempt)


def in_background(
    running: set[asyncio.Task[None]], work: Coroutine[Any, Any, None], request_id: str
) -> None:
    """Run ``work`` (a request's accounting) as a task kept in ``running`` until it ends;
    its failure is logged with ``request_id`` and counted in ``ACCOUNTING_LOST``."""
    task = asyncio.create_task(work)
    running.add(task)
    task.add_done_callback(functools.partial(_settled, running, request_id))


def _settled(running: set[asyncio.Task[None]], request_id: str, task: asyncio.Task[None]) -> None:
    running.discard(task)
    if task.cancelled():
        metrics.ACCOUNTING_LOST.labels(reason="cancelled").inc()
        log.warning("accounting of request %s lost: cancelled", request_id)
        return
    exc = task.exception()  # retrieved here, so asyncio never reports it as unretrieved
    if isinstance(exc, StoreUnavailable):
        metrics.ACCOUNTING_LOST.labels(reason="store_unavailable").inc()
        log.warning(
            "accounting of request %s lost after %d attempts: %s", request_id, ATTEMPTS, exc
        )
    elif exc is not None:
        metrics.ACCOUNTING_LOST.labels(reason="error").inc()
        log.error("accounting of request %s failed", request_id, exc_info=exc)
