"""One request through the gateway: ingest -> render -> route -> forward -> restore loop -> account.

Each step is its own module (``gateway.steps``); this one runs them in order. A
``Dialect`` (``gateway.dialects``) decodes the client's body into a transcript and writes
the upstream's OpenAI chunks back in the client's dialect; every reply is read upstream as
a stream of OpenAI chunks.

Store round trips of a request: one read (``ingest``), one write once an upstream accepted
the request (``commit``: the history and the route's assignment), one counter increment
after the reply (``account``). Restores answered in the loop add one write each, and a
tenant's quota limits their own charges.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

import orjson

from gateway import accounting, metrics
from gateway.config import GatewayConfig
from gateway.context_guard import ContextGuard
from gateway.dialects.base import Dialect
from gateway.dialects.errors import DialectError
from gateway.fold import make_renderer
from gateway.fold.renderer import Renderer
from gateway.identity import resolve_session, resolve_tenant
from gateway.quotas import Quotas
from gateway.request_cache import DecodeCache, Decoded, continued, session_ids
from gateway.steps import route
from gateway.steps.forward import Forward, context_too_long
from gateway.steps.ingest import Prepared, commit, ingest
from gateway.steps.render import Render, fold_options
from gateway.steps.restore import Outcome, replies
from gateway.tenants import Tenants, salt_secret
from gateway.transcript import Message
from gateway.upstream import ChatStream, UpstreamClient, UpstreamError
from router import ReplicaPool, RoutingPolicy
from router.replica import Replica
from store import NotFound

__all__ = ["Pipeline", "Prepared"]


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
        self._decoded = DecodeCache(config.decode_cache_bytes)
        self.tenants = Tenants(
            config.tenants, salt_secret(config.cache_salt_secret, bool(config.api_keys))
        )
        self.quotas = Quotas(store, self.tenants, config.lease_period_s)
        # With no budget configured, a cliff below the replicas' context window.
        self.guard = ContextGuard(
            pool.healthy,
            upstream.get_json,
            lambda spec, limit, fold: make_renderer(
                spec, k=config.k, budget=limit, **fold_options(spec, fold)
            ),
            enabled=config.budget is None,
        )
        self.render = Render(config, self.guard, self.pressure)
        self.forward = Forward(config, pool, policy, upstream, self.tenants, self.guard)

    async def drain(self) -> None:
        """Wait for accounting still in flight (before the store closes)."""
        if self._accounting:
            await asyncio.gather(*self._accounting, return_exceptions=True)

    def renderer(
        self, strategy: str, fold: str | None = None, budget: int | None = None
    ) -> Renderer:
        """The renderer for ``strategy`` (ReFold's ``fold`` mode, a tenant's ``budget``)."""
        return self.render.renderer(strategy, fold, budget)

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

    # -- decode and ingest -------------------------------------------------------------
    async def decode(self, dialect: Dialect, body: Any, headers: Mapping[str, str]) -> Decoded:
        """A client's request body decoded (volatile markers dropped), for ``prepare``; only
        what the session's previous request did not hold is decoded. A request that
        continues a kept reply is decoded after the conversation the store kept for it."""
        previous = dialect.continues(body) if isinstance(body, dict) else None
        if previous is not None:
            tenant = resolve_tenant(headers, self.config)
            session, kept = await self._kept_conversation(tenant, previous)
            return continued(dialect, body, session, kept)
        ids = (
            session_ids(headers, body, self.config.session_header) if isinstance(body, dict) else ()
        )
        return self._decoded.decode(dialect, body, ids)

    async def prepare(
        self, request: Decoded, body: Mapping[str, Any], headers: Mapping[str, str]
    ) -> Prepared:
        """A decoded request (``decode``, or ``Decoded.full`` of a whole decode) with what the
        store holds for it; nothing is stored yet (``run`` commits it)."""
        transcript = request.transcript
        tenant = resolve_tenant(headers, self.config)
        session = request.session or resolve_session(headers, body, tenant, transcript, self.config)
        settings = self.tenants.settings(tenant)
        strategy = (
            headers.get(self.config.strategy_header) or settings.strategy or self.config.strategy
        )
        fold = (
            headers.get(self.config.fold_header)
            or self.config.tenant_fold.get(tenant)
            or self.config.fold
        )
        # An unknown strategy is a 400 before any I/O.
        self.render.renderer(strategy, fold, settings.budget)
        # The read (which refuses a session over its size cap) before the quota charge, so
        # a request refused there charges nothing either.
        prepared = await ingest(
            self.store,
            tenant,
            session,
            request,
            strategy=strategy,
            fold=fold,
            stream=bool(body.get("stream")),
            max_bytes=settings.session_bytes,
            budget=settings.budget,
        )
        await self.quotas.admit_prompt(tenant, session, request.tokens)
        return prepared

    # -- render, route, forward --------------------------------------------------------
    async def run(self, prepared: Prepared) -> tuple[Replica, int, AsyncIterator[dict[str, Any]]]:
        """Render, route and open the upstream; once it accepted (first chunk in hand),
        store the history. Return the replica, the rendered prompt's token estimate and the
        chunks for the client.

        Routing, upstream and store errors before the first chunk raise from here, so the
        caller can still answer with a proper error status; nothing is stored then.
        """
        await self.forward.discover_model()
        rendered, tokens = self.render(prepared)
        body = self.forward.body(prepared, rendered)
        hints = route.hints(self.policy, prepared, tokens)
        if prepared.received is not None:
            metrics.ADDED_SECONDS.observe(time.perf_counter() - prepared.received)
        try:
            replica, stream = await self.forward.open(prepared, body, hints)
        except UpstreamError as exc:
            if not context_too_long(exc):
                raise
            replica, stream, tokens = await self.forward.open_compacted(
                prepared, rendered, exc, hints
            )
        try:
            stored = await commit(
                self.store, prepared, route.assignment(self.policy, prepared, replica)
            )
        except BaseException:
            stream.close()  # the client gets the store's error; the upstream stops
            raise
        if stored.assignment is not None:
            prepared.found = replace(prepared.found, assignment=stored.assignment)
        self.render.keep(prepared)
        prepared.rendered_tokens = tokens
        metrics.PROMPT_TOKENS.labels(kind="raw").inc(prepared.raw_tokens)
        metrics.PROMPT_TOKENS.labels(kind="rendered").inc(tokens)
        return replica, tokens, self._chunks(prepared, replica, stream)

    async def _ask_again(self, prepared: Prepared) -> tuple[Replica, ChatStream]:
        """After a restore: render with the restored content and ask the model again."""
        rendered, tokens = self.render(prepared)
        body = self.forward.body(prepared, rendered)
        return await self.forward.open(prepared, body, route.hints(self.policy, prepared, tokens))

    # -- restore loop, account ---------------------------------------------------------
    async def _chunks(
        self, prepared: Prepared, replica: Replica, stream: ChatStream
    ) -> AsyncIterator[dict[str, Any]]:
        outcome = Outcome(replica)
        async for chunk in replies(
            prepared,
            outcome,
            stream,
            store=self.store,
            pool=self.pool,
            guard=self.guard,
            ask_again=self._ask_again,
            max_restores=self.config.max_restores,
        ):
            yield chunk
        # Accounting is bookkeeping, not history: the client need not wait for it.
        request_id = uuid.uuid4().hex
        work = accounting.account(
            self.store,
            self.quotas,
            prepared,
            outcome.replica,
            outcome.usage,
            outcome.restores,
            request_id=request_id,
        )
        accounting.in_background(self._accounting, work, request_id)

    # -- kept replies (the Responses API's previous_response_id) -----------------------
    async def remember_reply(
        self, prepared: Prepared, reply_id: str, reply: Sequence[Message]
    ) -> None:
        """Keep ``reply`` (the messages the client would send back for it) under
        ``reply_id``, with where its conversation lives, for requests that continue it."""
        record = {
            "session": prepared.session,
            "branch": prepared.branch,
            "length": len(prepared.transcript.messages),
            "reply": [m.to_dict() for m in reply],
        }
        await self.store.put_reply(prepared.tenant, reply_id, orjson.dumps(record))

    async def _kept_conversation(self, tenant: str, reply_id: str) -> tuple[str, list[Message]]:
        """The session of a kept reply and its conversation up to and including the reply."""
        data = await self.store.get_reply(tenant, reply_id)
        if data is None:
            raise DialectError(
                f"no kept response {reply_id!r} (never stored, created with store=false, "
                "or expired)",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        record = orjson.loads(data)
        try:
            history = await self.store.load(tenant, record["session"], record["branch"])
        except NotFound as exc:
            raise DialectError(
                f"the conversation of response {reply_id!r} has expired",
                param="previous_response_id",
                code="previous_response_not_found",
            ) from exc
        kept = [Message.from_dict(m) for m in history.messages[: record["length"]]]
        kept += [Message.from_dict(m) for m in record["reply"]]
        return record["session"], kept
