"""One request through the gateway, as DESIGN's steps, one module each (``gateway.steps``):

admit -> decode -> ingest -> render -> route -> kv -> forward -> restore -> account -> reply.

(``kv``: the KV events' hints, working-set admission and vLLM priority; a no-op with
its switches off, ``gateway.steps.kv``.)

The tenant is admitted (a slot among its requests in flight, its request rate) before the
body is read, so a refused request costs no body read; its prompt's tokens are admitted
with the ingest, before anything is stored.

Each step hands the next a frozen result (``Caller``, ``Decoded``, ``Ingested``,
``Rendering``, ``Opened``, ``Stored``, ``Outcome``, ``Reply``); only the restore loop's own
state (``Restoring``: the gateway turns it adds) grows while the request runs. A
``Dialect`` (``gateway.dialects``) decodes the client's body into a transcript and writes
the upstream's OpenAI chunks back in the client's dialect.

Store round trips of a request: one read (``ingest.lookup``), one write once an upstream
accepted the request (``ingest.store_history``: the history and the route's assignment),
one counter increment after the reply (``account``). Restores answered in the loop add
one write each, and a tenant's quota limits their own charges; a non-streaming reply
that broke and was taken over by another replica adds one, which appends nothing.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from starlette.requests import Request

from gateway import metrics
from gateway.config import GatewayConfig
from gateway.context_guard import ContextGuard
from gateway.dialects.base import Dialect, Exchange
from gateway.disconnect import unless_disconnected
from gateway.fold.bound import Renderers
from gateway.fold.renderer import Renderer
from gateway.fold.spec import StrategySpec
from gateway.identity import Caller, identify, requested_strategy, resolve_session
from gateway.offload import Offload, is_large
from gateway.request_cache import Decoded
from gateway.steps import route
from gateway.steps.account import account, in_background, record
from gateway.steps.admit import Lease, Quotas
from gateway.steps.decode import Decoder
from gateway.steps.forward import Forward, Opened
from gateway.steps.ingest import Ingested, Stored, lookup, store_history
from gateway.steps.kept import remember_reply
from gateway.steps.kv import KvControl, Placement, first_token
from gateway.steps.render import Render
from gateway.steps.render_call import Rendering, keep, render
from gateway.steps.reply import Reply, reply
from gateway.steps.restore import Placed, RestoreLoop, Restoring, placed
from gateway.steps.rewrites import with_cleared_results_restored
from gateway.tenants import Tenants, salt_secret
from gateway.upstream import ChatStream, UpstreamClient
from router import ReplicaPool, RoutingPolicy
from router.replica import Replica

__all__ = ["Pipeline", "Started"]


@dataclass(frozen=True, slots=True)
class Started:
    """A request an upstream accepted: its history with the gateway's turns, the first
    rendering, the open upstream stream, and where the history was stored."""

    placed: Placed
    rendering: Rendering
    opened: Opened
    stored: Stored
    kv: Placement
    priority: int
    first_chunk_s: float | None  # from the send to the first replica's first chunk


class Pipeline:
    def __init__(
        self,
        config: GatewayConfig,
        store: Any,
        pool: ReplicaPool,
        policy: RoutingPolicy,
        upstream: UpstreamClient,
    ) -> None:
        self.config = config
        self.store = store
        self.pool = pool
        self.policy = policy
        self.upstream = upstream
        self._accounting: set[asyncio.Task[None]] = set()
        self.offload = Offload()  # large requests' steps, off the event loop
        self.decoder = Decoder(config, store, self.offload)
        self.tenants = Tenants(
            config.tenants, salt_secret(config.cache_salt_secret, bool(config.api_keys))
        )
        self.quotas = Quotas(store, self.tenants, config.lease_period_s)
        # With no budget configured, a cliff below the replicas' context window.
        self.guard = ContextGuard(
            pool.healthy, upstream.get_json, Renderers(config.k), enabled=config.budget is None
        )
        self.render = Render(config, self.guard, self.pressure)
        self.forward = Forward(config, pool, policy, upstream, self.tenants, self.guard)
        self.restore = RestoreLoop(store, pool, self.guard, config.max_restores)
        self.kv = KvControl(config, pool, self.tenants)

    async def serve(self, dialect: Dialect, request: Request) -> Reply:
        """One request, step by step. An error before the reply raises (the HTTP layer
        answers it in the dialect's shape); nothing is stored before an upstream accepted
        the request, and a client gone while the gateway waits raises ``ClientGone``."""
        received = time.perf_counter()
        caller: Caller | None = None
        lease: Lease | None = None
        status = "error"
        try:
            caller = identify(request.headers, self.config, self.tenants, self.render.spec)
            lease = await self.quotas.admit(caller.tenant)  # admit: before the body is read
            body = await self.decoder.read(request, dialect, caller.tenant)
            decoded = await self.decode(dialect, body, request.headers, caller.tenant)
            ingested = await self.ingest(caller, decoded, body, request.headers)
            # Render, route, forward; the history stored once an upstream accepted it.
            started = await unless_disconnected(request, self.start(ingested, received))
            status = "ok"
            chunks = self.replies(ingested, started)  # restore, then account
            kept = partial(remember_reply, self.store, ingested, started.stored)
            exchange = Exchange(body, remember=kept, context_edits=started.rendering.applied_edits)
            answer = await reply(
                dialect, request, ingested, started.opened, chunks, exchange, lease,
                started.kv.wait_s, started.kv.admission, partial(self.unread, started),
            )  # fmt: skip
            if answer.frames is not None:
                lease = None  # the stream gives it back
            return answer
        finally:
            if lease is not None:
                await lease.release()
            strategy = (
                caller.strategy if caller else requested_strategy(request.headers, self.config)
            )
            metrics.REQUESTS.labels(dialect.name, metrics.strategy_label(strategy), status).inc()

    async def decode(
        self, dialect: Dialect, body: Any, headers: Mapping[str, str], tenant: str
    ) -> Decoded:
        """The decode step (``gateway.steps.decode``), after refusing the vLLM fields the
        tenant may not send (``Tenants.check_request_fields``)."""
        if isinstance(body, dict):  # the dialect refuses any other
            self.tenants.check_request_fields(tenant, body)
        return await self.decoder.decode(dialect, body, headers, tenant)

    async def ingest(
        self, caller: Caller, request: Decoded, body: Mapping[str, Any], headers: Mapping[str, str]
    ) -> Ingested:
        """A decoded request (``decode``, or ``Decoded.full`` of a whole decode) with its
        session and what the store holds for it, admitted for its prompt; nothing stored."""
        session = request.session or resolve_session(
            headers, body, caller.tenant, request.transcript, self.config
        )
        # An unknown strategy is a 400 before any I/O.
        self.renderer(caller.tenant, caller.strategy, caller.fold, caller.budget)
        # A harness's microcompaction continues the branch it shortened (``steps.rewrites``).
        request = await with_cleared_results_restored(self.store, caller.tenant, session, request)
        # The read (which refuses a session over its size cap) before the quota charge, so
        # a request refused there charges nothing either.
        ingested = await lookup(
            self.store,
            caller,
            session,
            request,
            stream=bool(body.get("stream")),
            offload=self.offload,
        )
        await self.quotas.admit_prompt(caller.tenant, session, request.tokens)
        return ingested

    def rendered(
        self, ingested: Ingested, history: Placed | None = None, branch: int | None = None
    ) -> Rendering:
        """The render step (``gateway.steps.render_call``) over ``history`` (by default the
        request's messages with the gateway turns the store held)."""
        if history is None:
            history = placed(ingested.transcript.messages, ingested.found.gateway_turns)
        return render(self.render, ingested, *history, branch)

    async def rendered_body(
        self, ingested: Ingested, history: Placed, branch: int | None = None
    ) -> tuple[Rendering, dict[str, Any]]:
        """``rendered`` and the upstream body of its rendering; for a long history in the
        worker thread, after any render of the session already there (``gateway.offload``)."""

        def render_body() -> tuple[Rendering, dict[str, Any]]:
            rendering = self.rendered(ingested, history, branch)
            return rendering, self.forward.body(ingested, rendering.transcript)

        large = is_large(len(history[0]), ingested.raw_tokens)
        return await self.offload.run(large, (ingested.tenant, ingested.session), render_body)

    async def start(self, ingested: Ingested, received: float | None = None) -> Started:
        """Render, route and open the upstream; once it accepted (first chunk in hand),
        store the history. Routing, upstream and store errors before the first chunk (for a
        non-streaming client, before the whole reply is in) raise from here, so the client
        still gets a proper error status; nothing is stored before the first chunk.
        ``received``: when the gateway began the request, for the latency it adds."""
        await self.forward.discover_model()
        history = placed(ingested.transcript.messages, ingested.found.gateway_turns)
        rendering, body = await self.rendered_body(ingested, history)
        hints = route.hints(self.policy, ingested, rendering, ingested.found.assignment)
        if received is not None:
            metrics.ADDED_SECONDS.observe(time.perf_counter() - received)
        kv = await self.kv.place(ingested, hints)  # may wait for working-set admission
        priority = self.kv.scope(body, ingested, kv)
        stored: Stored | None = None
        first_chunk_s: float | None = None
        sent = time.monotonic()

        async def accepted(replica: Replica) -> None:
            # Again when another replica takes a broken non-streaming reply over: the history
            # is appended once (the write is idempotent), the assignment moves to that one.
            nonlocal stored, first_chunk_s
            if stored is None:
                first_chunk_s = time.monotonic() - sent
            self.kv.started(kv, replica.url)
            expected = stored.assignment if stored else ingested.found.assignment
            stored = await self.store_history(ingested, rendering, replica, expected)

        # A store error closes the upstream stream; the client gets the store's error.
        try:
            opened = await self.forward.send(ingested, rendering, body, kv.hints, accepted)
        except BaseException:
            self.kv.finish(kv, served=False)
            raise
        assert stored is not None  # send returns once a replica accepted
        metrics.PROMPT_TOKENS.labels(kind="raw").inc(ingested.raw_tokens)
        metrics.PROMPT_TOKENS.labels(kind="rendered").inc(opened.tokens)
        return Started(history, rendering, opened, stored, kv, priority, first_chunk_s)

    async def store_history(
        self,
        ingested: Ingested,
        rendering: Rendering,
        replica: Replica | None,
        expected: str | None = None,
    ) -> Stored:
        """Store the history with the route's assignment to ``replica`` (the one that
        accepted the request; ``expected``: the assignment it replaces, as read or as this
        request's last write left it), and keep the rendering's renderer cache."""
        assign = route.assignment(self.policy, ingested, replica, expected) if replica else None
        stored = await store_history(self.store, ingested, assign)
        keep(self.render, rendering, stored.branch)
        return stored

    async def replies(self, ingested: Ingested, started: Started) -> AsyncIterator[dict[str, Any]]:
        """The restore loop over the upstream's reply, then the request's accounting."""
        opened, stored = started.opened, started.stored
        restoring = Restoring(
            ingested, started.placed, opened.replica, opened.stats, started.rendering.pressure
        )
        ask_again = partial(self._ask_again, ingested, stored, started.kv)
        served = False
        try:
            async for chunk in self.restore.replies(
                ingested, stored, restoring, opened.stream, ask_again
            ):
                yield chunk
            served = True
        finally:
            measured = first_token(restoring.usage, started.first_chunk_s) if served else None
            self.kv.finish(
                started.kv, served=served, first_token=measured, pausing=not restoring.ended_turn
            )
        # Accounting is bookkeeping, not history: the client need not wait for it.
        request_id = uuid.uuid4().hex
        outcome = restoring.outcome()
        logged = record(
            ingested, opened, outcome, admission_wait_s=started.kv.wait_s, priority=started.priority
        )
        work = account(
            self.store, self.quotas, ingested, stored, logged, outcome, request_id=request_id
        )
        in_background(self._accounting, work, request_id)

    def unread(self, started: Started) -> None:
        """A reply whose chunks (``replies``) were never read to their end, their own cleanup
        not run (a client gone before the first frame): the upstream stream is closed, so
        the replica stops generating, and the request's admission share ends, unserved.
        Idempotent, and a no-op after ``replies`` ended (the stream released, the share
        finished)."""
        started.opened.stream.close()
        self.kv.finish(started.kv, served=False)

    async def _ask_again(
        self, ingested: Ingested, stored: Stored, kv: Placement, restoring: Restoring
    ) -> tuple[Replica, ChatStream, Rendering]:
        """After a restore: render with the restored content and ask the model again (the
        request's admission still holds)."""
        history = (restoring.history, restoring.state)
        rendering, body = await self.rendered_body(ingested, history, stored.branch)
        self.kv.scope(body, ingested, kv)
        hints = route.hints(self.policy, ingested, rendering, stored.assignment)
        replica, stream = await self.forward.open(ingested, body, hints)
        return replica, stream, rendering

    async def drain(self) -> None:
        """Wait for accounting still in flight (before the store closes); stop following
        the replicas' KV events."""
        if self._accounting:
            await asyncio.gather(*self._accounting, return_exceptions=True)
        await self.kv.close()

    def renderer(
        self,
        tenant: str,
        strategy: str | StrategySpec,
        fold: str | None = None,
        budget: int | None = None,
    ) -> Renderer:
        """The ``tenant``'s renderer for ``strategy`` (ReFold's ``fold`` mode, the tenant's
        ``budget``)."""
        return self.render.renderer(tenant, strategy, fold, budget)

    def pressure(self) -> float:
        """KV pressure for pricing ReFold's rewrites: the mean ``kv_cache_usage_perc`` of the
        healthy replicas (the session's own replica is chosen after rendering)."""
        usages = [
            r.metrics.kv_cache_usage
            for r in self.pool.healthy()
            if r.metrics is not None and r.metrics.kv_cache_usage is not None
        ]
        return sum(usages) / len(usages) if usages else 0.0

    async def models(self) -> list[dict[str, Any]]:
        """What the replicas serve (the first healthy replica that answers)."""
        return await self.forward.models()
