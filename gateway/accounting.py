"""Account: what each request of a session cost and what the gateway did to it.

Running totals are the store's counters (``add_counts``: atomic increments, exact under
concurrency); ``log``, one record per request in arrival order, is the branch's request
log, appended by the same call. A record keeps ``messages``, the length of the history
the request carried, so what the model saw at that request can be rendered again from the
stored history, which never changes (``gateway.session_view``).

Written after the reply (the client does not wait) in one store round trip, retried on a
store outage under the request's id as its token, so a retry after a lost reply counts
nothing twice while concurrent identical requests each count. It runs as a background task
(``in_background``) whose failure is logged with the request id and counted, never left
unretrieved.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import orjson

from gateway import metrics
from gateway.quotas import Quotas
from store import SessionStore, StoreUnavailable

if TYPE_CHECKING:
    from gateway.steps.ingest import Prepared
    from router.replica import Replica

log = logging.getLogger("foldgate")

ATTEMPTS = 3
RETRY_S = 0.5  # the first wait before retrying a write the store refused; doubles after

# Totals summed over the branch's requests.
SUMMED = (
    "requests",
    "raw_tokens",
    "rendered_tokens",
    "upstream_prompt_tokens",
    "upstream_cached_tokens",
    "rendered_tokens_added",
    "rendered_tokens_removed_by_stubs",
    "rendered_tokens_removed_by_folds",
    "restores",
    "overflow_retries",
)


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request. Token figures: ``raw``/``rendered`` are the gateway's estimates
    (bytes/4) of what the harness sent and what went upstream; ``upstream_*`` are what the
    replica reported (its tokenizer, its prefix cache), summed over restore attempts.

    ``fold``, ``pressure`` and ``tools`` are what the rendering depended on besides the
    history: ReFold's fold mode, the KV pressure its rewrites were priced at, and whether
    (which) tools the request offered."""

    messages: int
    strategy: str
    fold: str
    pressure: float
    tools: tuple[str, ...]
    replica: str
    raw_tokens: int
    rendered_tokens: int
    upstream_prompt_tokens: int
    upstream_cached_tokens: int
    # Where the tokens went in the context sent (estimates): what the strategy added
    # (protocol text, labels, notes, its tool) and what its stubs and folds removed.
    rendered_tokens_added: int
    rendered_tokens_removed_by_stubs: int
    rendered_tokens_removed_by_folds: int
    # The rendering's own counts: stubs and folded steps in the context sent, and how many
    # times the strategy rewrote already-sent context or compacted the history so far.
    stubs: int
    folds: int
    rewrites: int
    compactions: int
    restores: int
    # Smaller renderings tried after the replica refused the context as too long.
    overflow_retries: int
    at: float

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> RequestRecord:
        """A stored record; fields it predates read as empty (0, "", no tools)."""
        empty = {"int": 0, "float": 0.0, "str": ""}
        values: dict[str, Any] = {}
        for f in fields(cls):
            default = () if f.name == "tools" else empty[str(f.type)]
            values[f.name] = raw.get(f.name, default)
        values["tools"] = tuple(values["tools"])
        return cls(**values)


def tool_names(tools: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """The names of a request's tool schemas (OpenAI's nested or Anthropic's flat shape)."""
    names = []
    for tool in tools:
        function = tool.get("function")
        name = function.get("name") if isinstance(function, Mapping) else tool.get("name")
        names.append(name if isinstance(name, str) else "?")
    return tuple(names)


_RECORD_FIELDS = tuple(f.name for f in fields(RequestRecord))


def _as_dict(request: RequestRecord) -> dict[str, Any]:
    """``dataclasses.asdict`` for a record of flat values (it deep-copies each one)."""
    return {name: getattr(request, name) for name in _RECORD_FIELDS}


@dataclass(frozen=True, slots=True)
class Ledger:
    totals: dict[str, int]
    log: tuple[RequestRecord, ...]


async def account(
    store: SessionStore,
    quotas: Quotas,
    prepared: Prepared,
    replica: Replica,
    usage: Sequence[Mapping[str, Any]],
    restores: int,
    *,
    request_id: str,
) -> None:
    """Count one request in its branch's and tenant's counters and log it; the store's
    ``StoreUnavailable`` when every attempt failed."""
    prompt = sum(u.get("prompt_tokens", 0) for u in usage)
    cached = sum((u.get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0 for u in usage)
    metrics.UPSTREAM_PROMPT_TOKENS.inc(prompt)
    metrics.UPSTREAM_CACHED_TOKENS.inc(cached)
    stats = prepared.stats
    request = RequestRecord(
        messages=len(prepared.transcript.messages),
        strategy=str(prepared.strategy),
        fold=prepared.fold,
        pressure=prepared.pressure,
        tools=tool_names(prepared.transcript.tools),
        replica=replica.url,
        raw_tokens=prepared.raw_tokens,
        rendered_tokens=prepared.rendered_tokens,
        upstream_prompt_tokens=prompt,
        upstream_cached_tokens=cached,
        rendered_tokens_added=stats.overhead_tokens,
        rendered_tokens_removed_by_stubs=stats.stub_saved_tokens,
        rendered_tokens_removed_by_folds=stats.fold_saved_tokens,
        stubs=stats.stubs,
        folds=stats.folded_steps,
        rewrites=stats.rewrites,
        compactions=stats.compactions,
        restores=restores,
        overflow_retries=prepared.overflow_retries,
        at=time.time(),
    )
    counts = {name: getattr(request, name) for name in SUMMED if name != "requests"}
    counts["requests"] = 1
    # What the replica holds of this session now, its last prompt: the cached-prefix
    # estimate routing prices the session's next move with.
    latest = {"last_prompt_tokens": int(usage[-1].get("prompt_tokens", 0))} if usage else None
    assert prepared.branch is not None, "a request is accounted after its history is stored"
    for attempt in range(ATTEMPTS):
        try:
            await store.add_counts(
                prepared.tenant,
                prepared.session,
                prepared.branch,
                counts,
                # The request's own token: a write retried after a lost reply adds nothing,
                # while concurrent identical requests each add theirs.
                token=request_id,
                latest=latest,
                record=orjson.dumps(_as_dict(request)),
            )
            await quotas.record_upstream(prepared.tenant, prompt)
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


async def read(store: SessionStore, tenant: str, session: str, branch: int) -> Ledger:
    """The branch's ledger; ``store.NotFound`` when the session or branch does not exist."""
    counts = await store.get_counts(tenant, session, branch)
    records = await store.get_log(tenant, session, branch)
    return Ledger(
        {name: int(counts.get(name, 0)) for name in SUMMED},
        tuple(RequestRecord.from_dict(json.loads(r)) for r in records),
    )
