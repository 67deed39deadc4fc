"""Forward: the rendered context as a streaming chat request to the replica the route picks.

Failover to another replica happens only while nothing reached the client
(``router.with_failover``). A replica has accepted the request once its first chunk is in
hand (``accepted`` stores the history then); ``open`` returns then for a streaming client,
and once the whole reply is read for one that waits for it, so a reply that breaks before
its end is taken over by another replica (and ``accepted`` runs again for that one). The
replica's success is reported once the reply is read to its end (``router.reading_reply``,
in the restore loop). A replica that refuses the context as too long gets the overflow
ladder: CliffCompaction's rungs over the rendering, smaller each
time, until one is taken.
With no configured upstream model, the replicas' one served model is used (discovered
once from ``/v1/models``).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import orjson

from gateway import metrics
from gateway.config import GatewayConfig
from gateway.context_guard import ContextGuard
from gateway.dialects.openai_chat import encode_request
from gateway.fold.bound import overflow_ladder
from gateway.fold.renderer import RenderStats, estimate_tokens
from gateway.steps.ingest import Ingested
from gateway.steps.render_call import Rendering
from gateway.tenants import Tenants
from gateway.transcript import Transcript
from gateway.upstream import ChatStream, UpstreamClient, UpstreamError
from router import ReplicaPool, RouteHints, RoutingPolicy, with_failover
from router.replica import Replica
from router.session_route import prefill_estimate

_CONTEXT_TOO_LONG = re.compile(
    r"maximum context length|maximum model length|context length|prompt is too long", re.I
)


# What the request path does once a replica accepted the request (its first chunk in hand):
# store the history. It may run again, for the replica that takes a broken reply over.
Accepted = Callable[[Replica], Awaitable[None]]


def context_too_long(exc: UpstreamError) -> bool:
    return exc.status == 400 and bool(_CONTEXT_TOO_LONG.search(str(exc)))


@dataclass(frozen=True, slots=True)
class Opened:
    """An upstream stream whose first chunk is in hand: the replica, the token estimate and
    stats of the context it accepted (an overflow rung's, after a refusal), and how many
    smaller renderings were tried."""

    replica: Replica
    stream: ChatStream
    tokens: int
    stats: RenderStats
    overflow_retries: int


class Forward:
    def __init__(
        self,
        config: GatewayConfig,
        pool: ReplicaPool,
        policy: RoutingPolicy,
        upstream: UpstreamClient,
        tenants: Tenants,
        guard: ContextGuard,
    ) -> None:
        self.config = config
        self.pool = pool
        self.policy = policy
        self.upstream = upstream
        self.tenants = tenants
        self.guard = guard
        self.upstream_model = config.upstream_model
        self._model_discovered = False

    def body(self, ingested: Ingested, rendered: Transcript) -> dict[str, Any]:
        """The rendered context as a streaming chat request for a vLLM replica."""
        # ReFold adds its restore tool to the rendered transcript itself, once it pays.
        body = encode_request(rendered.with_messages(()))
        # The messages as JSON already (orjson writes a Fragment as is): the memo encodes
        # only what the session's last request did not send.
        body["messages"] = orjson.Fragment(ingested.memo.messages_json(rendered.messages))
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        if self.upstream_model:
            body["model"] = self.upstream_model
        self.tenants.scope_upstream_body(ingested.tenant, body)
        return body

    async def models(self) -> list[dict[str, Any]]:
        """What the replicas serve: the listing of the first healthy replica that lists a
        model (one that answers an error or no listing is skipped); none: empty."""
        for replica in self.pool.healthy():
            try:
                served = await self.upstream.served_models(replica.url)
            except UpstreamError:
                continue
            if served:
                return served
        return []

    async def discover_model(self) -> None:
        """With no configured upstream model, use the replicas' one model when they serve
        one (until a replica lists one, the client's model goes upstream); then the
        context guard learns its window."""
        if self.upstream_model is None and not self._model_discovered:
            served = await self.models()
            self._model_discovered = bool(served)
            if len(served) == 1:
                self.upstream_model = served[0]["id"]
        await self.guard.learn(self.upstream_model)

    async def send(
        self,
        ingested: Ingested,
        rendering: Rendering,
        body: dict[str, Any],
        hints: RouteHints,
        accepted: Accepted,
    ) -> Opened:
        """Open the upstream with ``body`` (``rendering`` as ``body`` built it); a replica
        that refuses it as too long gets the overflow ladder."""
        try:
            replica, stream = await self.open(ingested, body, hints, accepted)
        except UpstreamError as exc:
            if not context_too_long(exc):
                raise
            return await self.open_compacted(ingested, rendering, exc, hints, accepted)
        return Opened(replica, stream, rendering.tokens, rendering.stats, 0)

    async def open(
        self,
        ingested: Ingested,
        body: dict[str, Any],
        hints: RouteHints | None = None,
        accepted: Accepted | None = None,
    ) -> tuple[Replica, ChatStream]:
        """Route and open the upstream stream, failing over while nothing reached the
        client; ``accepted`` runs once a replica's first chunk is in hand. ``hints`` (the
        rendered prompt's size, the session's assignment) go to the policy."""

        async def attempt(replica: Replica) -> tuple[Replica, ChatStream]:
            # With the KV events in the hints, the prefill it sends counts on the replica
            # until the first chunk (``sticky_cost``'s queue wait weighs that backlog).
            sized = prefill_estimate(hints, replica.url) if hints is not None else None
            try:
                with replica.prefill(sized):
                    stream = await self.upstream.open_chat_stream(replica.url, body)
            except UpstreamError as exc:
                metrics.UPSTREAM_ERRORS.labels(kind=str(exc.status)).inc()
                raise
            try:
                if accepted is not None:
                    await accepted(replica)
                if not ingested.stream:
                    # A client that waits for the whole reply has seen nothing of it until
                    # it is read to its end: read it here, where a break still fails over.
                    await stream.read_whole()
            except BaseException as exc:
                stream.close()  # the store refused it, or it broke: the replica stops
                if isinstance(exc, UpstreamError):
                    metrics.UPSTREAM_ERRORS.labels(kind=str(exc.status)).inc()
                raise
            return replica, stream

        return await with_failover(
            self.policy,
            self.pool,
            ingested.tenant,
            ingested.session,
            attempt,
            max_attempts=self.config.max_attempts,
            hints=hints,
            streamed=True,  # the restore loop reports the reply's outcome at its end
        )

    async def open_compacted(
        self,
        ingested: Ingested,
        rendering: Rendering,
        refusal: UpstreamError,
        hints: RouteHints,
        accepted: Accepted,
    ) -> Opened:
        """The upstream refused the context as too long: walk CliffCompaction's ladder over
        the rendering, retrying with each smaller rung until one is accepted. A rung keeps
        the rendering's tools and restore hints, so it offers the restores it offered."""
        offer = {
            "restore_tool": rendering.stats.restore_tool,
            "text_restores": rendering.stats.text_restores,
        }
        for retries, rung in enumerate(overflow_ladder(rendering.transcript), start=1):
            metrics.OVERFLOW_RETRIES.inc()
            try:
                replica, stream = await self.open(
                    ingested, self.body(ingested, rung.transcript), hints, accepted
                )
            except UpstreamError as exc:
                if not context_too_long(exc):
                    raise
                refusal = exc
                continue
            tokens = sum(estimate_tokens(m) for m in rung.transcript.messages)
            self.guard.rendered((ingested.tenant, ingested.session), tokens, compacted=False)
            return Opened(replica, stream, tokens, replace(rung.stats, **offer), retries)
        raise refusal
