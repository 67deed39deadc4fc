"""One request through the gateway: ingest -> render -> route -> forward -> restore loop -> account.

The pipeline is dialect-neutral: a ``Dialect`` (``gateway.dialects``) decodes the client's
body into a transcript and writes the upstream's OpenAI chunks back in the client's
dialect. Every reply is read upstream as a stream of OpenAI chunks.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from gateway import accounting, metrics
from gateway.config import GatewayConfig
from gateway.context_guard import ContextGuard
from gateway.dialects.base import Dialect
from gateway.dialects.errors import DialectError
from gateway.dialects.openai_chat import decode_reply, encode_request
from gateway.fold import make_renderer
from gateway.fold.cliff import Cliff
from gateway.fold.renderer import Renderer, RenderState, RenderStats, estimate_tokens
from gateway.fold.restore import parse_restore_spec, restore_outputs
from gateway.identity import resolve_session, resolve_tenant
from gateway.quotas import Quotas
from gateway.replies import Decision, ReplyFilter
from gateway.request_cache import DecodeCache, Decoded, MessageMemo, continued, session_ids
from gateway.tenants import Tenants, salt_secret
from gateway.transcript import Message, Text, Transcript
from gateway.upstream import ChatStream, UpstreamClient, UpstreamError
from router import ReplicaPool, RouteHints, RoutingPolicy, with_failover
from router.replica import Replica
from store import NotFound, StoreUnavailable

log = logging.getLogger("foldgate")

RENDER_CACHE_SESSIONS = 4096
ACCOUNT_ATTEMPTS = 3
UNBOUNDED_TOKENS = 1 << 40
_CONTEXT_TOO_LONG = re.compile(
    r"maximum context length|maximum model length|context length|prompt is too long", re.I
)


def _context_too_long(exc: UpstreamError) -> bool:
    return exc.status == 400 and bool(_CONTEXT_TOO_LONG.search(str(exc)))


def with_gateway_turns(
    messages: Sequence[Message], turns: Mapping[int, Sequence[Mapping[str, Any]]]
) -> tuple[list[Message], list[int]]:
    """The harness's messages with the gateway's own turns (restore exchanges, stored by the
    index of the message they follow) put back in place, and the history indices of the
    gateway-made messages that carry restored content."""
    history: list[Message] = []
    restored: list[int] = []
    for position in range(len(messages) + 1):
        if position < len(messages):
            history.append(messages[position])
        for raw in turns.get(position, ()):
            message = Message.from_dict(raw)
            if message.role != "assistant":
                restored.append(len(history))
            history.append(message)
    return history, restored


def _fold_options(strategy: str, fold: str) -> dict[str, str]:
    """``make_renderer`` options for ReFold's fold mode (only a strategy with refold takes it)."""
    return {"fold": fold} if "refold" in strategy.split("+") else {}


@dataclass
class Prepared:
    """A decoded, ingested request, ready to render and forward."""

    tenant: str
    session: str
    branch: int
    strategy: str
    fold: str  # ReFold's fold mode for this request ("auto", "on", "off")
    budget: int | None  # the tenant's token budget; None: the gateway's
    transcript: Transcript
    history: list[Message]
    state: RenderState
    text_actions: bool
    stream: bool
    raw_tokens: int
    # What is derived from each message (store dicts, token estimates, upstream encoding),
    # reused across the session's requests when they reuse the message objects.
    memo: MessageMemo = field(default_factory=MessageMemo)
    # For the session's accounting: the last rendering's stats (what the strategy added and
    # removed) and the KV pressure it was priced at, the first rendering's token estimate
    # (the response header's figure), and the overflow ladder's retries.
    stats: RenderStats = field(default_factory=RenderStats)
    pressure: float = 0.0
    rendered_tokens: int = 0
    overflow_retries: int = 0
    # perf_counter() when the gateway began the request (before reading its body), for the
    # latency it adds before the upstream is asked.
    received: float | None = None


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
        self._renderers: dict[str, Renderer] = {}
        self._caches: OrderedDict[tuple[str, str, int, str], Any] = OrderedDict()
        self._reprefill: dict[tuple[str, str, int, str], int] = {}
        self.upstream_model = config.upstream_model
        self._model_discovered = False
        self._accounting: set[asyncio.Task[None]] = set()
        self._decoded = DecodeCache()
        self.tenants = Tenants(
            config.tenants, salt_secret(config.cache_salt_secret, bool(config.api_keys))
        )
        self.quotas = Quotas(store, self.tenants)
        # With no budget configured, a cliff below the replicas' context window.
        self.guard = ContextGuard(
            pool.healthy,
            upstream.get_json,
            lambda spec, limit, fold: make_renderer(
                spec, k=config.k, budget=limit, **_fold_options(spec, fold)
            ),
            enabled=config.budget is None,
        )

    async def drain(self) -> None:
        """Wait for accounting still in flight (before the store closes)."""
        if self._accounting:
            await asyncio.gather(*self._accounting, return_exceptions=True)

    def renderer(
        self, strategy: str, fold: str | None = None, budget: int | None = None
    ) -> Renderer:
        """The renderer for ``strategy``; ``fold`` (ReFold's fold mode) defaults to the
        config's and only matters when the strategy contains refold; ``budget`` (a tenant's)
        to the config's."""
        fold = fold or self.config.fold
        budget = self.config.budget if budget is None else budget
        key = f"{strategy}/{fold}" if "refold" in strategy.split("+") else strategy
        key = f"{key}@{budget}"
        if key not in self._renderers:
            try:
                self._renderers[key] = make_renderer(
                    strategy,
                    k=self.config.k,
                    budget=budget,
                    **_fold_options(strategy, fold),
                )
            except ValueError as exc:
                header = self.config.strategy_header
                if "fold mode" in str(exc):
                    header = self.config.fold_header
                raise DialectError(str(exc), param=header) from exc
        return self._renderers[key]

    def pressure(self) -> float:
        """KV pressure for pricing ReFold's rewrites: the mean ``kv_cache_usage_perc`` of the
        healthy replicas (the session's own replica is chosen after rendering)."""
        usages = [
            r.metrics.kv_cache_usage
            for r in self.pool.healthy()
            if r.metrics is not None and r.metrics.kv_cache_usage is not None
        ]
        return sum(usages) / len(usages) if usages else 0.0

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

    async def prepare(
        self, request: Decoded, body: Mapping[str, Any], headers: Mapping[str, str]
    ) -> Prepared:
        """Ingest a decoded request (``decode``, or ``Decoded.full`` of a whole decode)."""
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
        self.renderer(strategy, fold, settings.budget)
        await self.quotas.admit_prompt(tenant, session, request.tokens)
        stored = await self.store.ingest(
            tenant, session, request.stored, max_bytes=settings.session_bytes
        )
        history, restored = await self._history(tenant, session, stored.branch_id, transcript)
        return Prepared(
            tenant=tenant,
            session=session,
            branch=stored.branch_id,
            strategy=strategy,
            fold=fold,
            budget=settings.budget,
            transcript=transcript,
            history=history,
            state=RenderState(restored=frozenset(restored)),
            text_actions=not transcript.tools,
            stream=bool(body.get("stream")),
            raw_tokens=request.tokens,
            memo=request.memo,
        )

    async def _history(
        self, tenant: str, session: str, branch: int, transcript: Transcript
    ) -> tuple[list[Message], list[int]]:
        """The harness's messages with the gateway's own turns (restores) put back in place."""
        turns = (await self.store.load(tenant, session, branch, messages=False)).gateway_turns
        return with_gateway_turns(transcript.messages, turns)

    def render(self, prepared: Prepared) -> tuple[Transcript, int]:
        session = (prepared.tenant, prepared.session)
        # A tenant's own budget replaces the guard's window-derived one.
        guarded = (
            self.guard.renderer(session, prepared.strategy, prepared.transcript, prepared.fold)
            if prepared.budget is None
            else None
        )
        renderer = guarded or self.renderer(prepared.strategy, prepared.fold, prepared.budget)
        key = (prepared.tenant, prepared.session, prepared.branch, prepared.strategy)
        started = time.perf_counter()
        prepared.pressure = self.pressure()
        rendered = renderer.render(
            prepared.transcript.with_messages(prepared.history),
            replace(prepared.state, pressure=prepared.pressure),
            self._caches.get(key),
        )
        metrics.RENDER_SECONDS.observe(time.perf_counter() - started)
        self._caches[key] = rendered.cache
        self._caches.move_to_end(key)
        while len(self._caches) > RENDER_CACHE_SESSIONS:
            evicted, _ = self._caches.popitem(last=False)
            self._reprefill.pop(evicted, None)
        stats = rendered.stats
        metrics.STUBS.inc(stats.stubs)
        metrics.FOLDS.inc(stats.folded_steps)
        metrics.RENDER_TOKENS.labels(kind="added").inc(stats.overhead_tokens)
        metrics.RENDER_TOKENS.labels(kind="removed_by_stubs").inc(stats.stub_saved_tokens)
        metrics.RENDER_TOKENS.labels(kind="removed_by_folds").inc(stats.fold_saved_tokens)
        # Rewrites are counted once, when the session's renderer takes them.
        reprefill = stats.reprefill_tokens - self._reprefill.get(key, 0)
        if reprefill > 0:
            metrics.RENDER_TOKENS.labels(kind="reprefilled_by_rewrites").inc(reprefill)
        self._reprefill[key] = stats.reprefill_tokens
        prepared.stats = stats
        tokens = prepared.memo.tokens(rendered.transcript.messages)
        self.guard.rendered(session, tokens, compacted=stats.compactions > 0)
        return rendered.transcript, tokens

    def upstream_body(self, prepared: Prepared, rendered: Transcript) -> dict[str, Any]:
        """The rendered context as a streaming chat request for a vLLM replica."""
        # ReFold adds its restore tool to the rendered transcript itself, once it pays.
        body = encode_request(rendered, prepared.memo.encode)
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        if self.upstream_model:
            body["model"] = self.upstream_model
        self.tenants.scope_upstream_body(prepared.tenant, body)
        return body

    async def models(self) -> list[dict[str, Any]]:
        """What the replicas serve (the first healthy replica that answers)."""
        for replica in self.pool.healthy():
            try:
                return list((await self.upstream.get_json(f"{replica.url}/v1/models"))["data"])
            except (UpstreamError, OSError, ValueError, KeyError):
                continue
        return []

    async def _discover_model(self) -> None:
        """With no configured upstream model, use the replicas' one model when they serve one."""
        if self.upstream_model is None and not self._model_discovered:
            served = await self.models()
            self._model_discovered = bool(served)
            if len(served) == 1:
                self.upstream_model = served[0]["id"]

    async def open(
        self, prepared: Prepared, body: dict[str, Any], hints: RouteHints | None = None
    ) -> tuple[Replica, ChatStream]:
        """Route and open the upstream stream, failing over before the first chunk.
        ``hints`` (the rendered prompt's size) let a cost-aware policy price a move."""

        async def attempt(replica: Replica) -> tuple[Replica, ChatStream]:
            try:
                return replica, await self.upstream.open_chat_stream(replica.url, body)
            except UpstreamError as exc:
                metrics.UPSTREAM_ERRORS.labels(kind=str(exc.status)).inc()
                raise

        return await with_failover(
            self.policy,
            self.pool,
            prepared.tenant,
            prepared.session,
            attempt,
            max_attempts=self.config.max_attempts,
            hints=hints,
        )

    async def run(self, prepared: Prepared) -> tuple[Replica, int, AsyncIterator[dict[str, Any]]]:
        """Open the first upstream attempt; return the replica, the rendered prompt's token
        estimate and the chunks for the client.

        Routing and upstream errors before the first chunk raise from here, so the caller
        can still answer with a proper error status.
        """
        await self._discover_model()
        await self.guard.learn(self.upstream_model)
        rendered, tokens = self.render(prepared)
        body = self.upstream_body(prepared, rendered)
        hints = RouteHints(
            prompt_tokens=tokens, cached_prefix_tokens=await self._cached_prefix(prepared)
        )
        if prepared.received is not None:
            metrics.ADDED_SECONDS.observe(time.perf_counter() - prepared.received)
        try:
            replica, stream = await self.open(prepared, body, hints)
        except UpstreamError as exc:
            if not _context_too_long(exc):
                raise
            replica, stream, tokens = await self._open_compacted(prepared, rendered, exc)
        prepared.rendered_tokens = tokens
        metrics.PROMPT_TOKENS.labels(kind="raw").inc(prepared.raw_tokens)
        metrics.PROMPT_TOKENS.labels(kind="rendered").inc(tokens)
        return replica, tokens, self._chunks(prepared, replica, stream)

    async def _open_compacted(
        self, prepared: Prepared, rendered: Transcript, refusal: UpstreamError
    ) -> tuple[Replica, ChatStream, int]:
        """The upstream refused the context as too long: walk CliffCompaction's ladder over
        the rendering, retrying with each smaller rung until one is accepted."""
        # The threshold only decides unforced compactions; the ladder ignores it.
        ladder = Cliff(threshold=UNBOUNDED_TOKENS).compact_for_overflow(rendered)
        for rung in ladder:
            metrics.OVERFLOW_RETRIES.inc()
            prepared.overflow_retries += 1
            try:
                replica, stream = await self.open(
                    prepared, self.upstream_body(prepared, rung.transcript)
                )
            except UpstreamError as exc:
                if not _context_too_long(exc):
                    raise
                refusal = exc
                continue
            prepared.stats = rung.stats
            tokens = sum(estimate_tokens(m) for m in rung.transcript.messages)
            self.guard.rendered((prepared.tenant, prepared.session), tokens, compacted=False)
            return replica, stream, tokens
        raise refusal

    async def _chunks(
        self, prepared: Prepared, replica: Replica, stream: ChatStream
    ) -> AsyncIterator[dict[str, Any]]:
        restores = 0
        usage: list[dict[str, Any]] = []
        first = True
        while True:
            reply_filter = ReplyFilter(text_actions=prepared.text_actions, first_attempt=first)
            with replica.track():
                async for chunk in stream:
                    for out in reply_filter.feed(chunk):
                        yield out
            released, decision = reply_filter.finish()
            for out in released:
                yield out
            if decision.usage:
                usage.append(dict(decision.usage))
                self.guard.observe((prepared.tenant, prepared.session), decision.usage)
            if not decision.restores:
                break
            if restores >= self.config.max_restores:
                break
            restores += 1
            await self._answer_restore(prepared, decision)
            if decision.other_calls:
                # The other calls went to the harness; the restored content, recorded,
                # joins the context of its next request.
                break
            rendered, _ = self.render(prepared)
            replica, stream = await self.open(prepared, self.upstream_body(prepared, rendered))
            first = False
        for out in decision.tail:
            yield out
        # Accounting is bookkeeping, not history: the client need not wait for it.
        task = asyncio.create_task(self._account(prepared, replica, usage, restores))
        self._accounting.add(task)
        task.add_done_callback(self._accounting.discard)

    async def _answer_restore(self, prepared: Prepared, decision: Decision) -> None:
        """Answer a restore request from the history and record the exchange.

        The exchange is recorded after the request's last message, so the model's next
        attempt (and every later render) sees it before the model's reply.
        """
        asked = decode_reply(decision.asked)
        if prepared.text_actions:
            answers = [Message("user", (Text(self._restored_text(prepared, decision.restores)),))]
        else:
            answers = [
                Message(
                    "tool",
                    (Text(self._restored_text(prepared, [spec])),),
                    tool_call_id=call["id"],
                )
                for call, spec in zip(decision.restore_calls, decision.restores, strict=True)
            ]
        metrics.RESTORES.labels(mode="text" if prepared.text_actions else "tool").inc()
        await self.store.append_gateway_turns(
            prepared.tenant,
            prepared.session,
            prepared.branch,
            len(prepared.transcript.messages) - 1,
            [m.to_dict() for m in (asked, *answers)],
        )
        prepared.history, restored = await self._history(
            prepared.tenant, prepared.session, prepared.branch, prepared.transcript
        )
        prepared.state = RenderState(restored=frozenset(restored))

    def _restored_text(self, prepared: Prepared, specs: list[str]) -> str:
        history = prepared.transcript.with_messages(prepared.history)
        parts = []
        for spec in specs:
            try:
                first, last = parse_restore_spec(spec)
                for step, text in restore_outputs(history, prepared.state, first, last):
                    parts.append(f"[restored step {step}]\n{text}")
            except ValueError as exc:
                parts.append(f"restore {spec} failed: {exc}")
        return "\n\n".join(parts)

    async def _cached_prefix(self, prepared: Prepared) -> int | None:
        """The session's last prompt from its accounting, for a policy that prices moves
        with it (one store read); None otherwise or before the session's first reply."""
        if not self.policy.uses_cached_prefix:
            return None
        try:
            counts = await self.store.get_counts(prepared.tenant, prepared.session, prepared.branch)
        except NotFound:
            return None
        return counts.get("last_prompt_tokens")

    async def _account(
        self, prepared: Prepared, replica: Replica, usage: list[dict[str, Any]], restores: int
    ) -> None:
        prompt = sum(u.get("prompt_tokens", 0) for u in usage)
        cached = sum(
            (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0 for u in usage
        )
        metrics.UPSTREAM_PROMPT_TOKENS.inc(prompt)
        metrics.UPSTREAM_CACHED_TOKENS.inc(cached)
        stats = prepared.stats
        request = accounting.RequestRecord(
            messages=len(prepared.transcript.messages),
            strategy=prepared.strategy,
            fold=prepared.fold,
            pressure=prepared.pressure,
            tools=accounting.tool_names(prepared.transcript.tools),
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
        # Totals by atomic increments (exact under concurrency); the per-request record
        # beside them is for the session view.
        counts = {name: getattr(request, name) for name in accounting.SUMMED if name != "requests"}
        counts["requests"] = 1
        # The request's own token: a write retried after a lost reply adds nothing, while
        # concurrent identical requests each add theirs.
        token = uuid.uuid4().hex
        # What the replica holds of this session now, its last prompt: the cached-prefix
        # estimate routing prices the session's next move with.
        latest = {"last_prompt_tokens": int(usage[-1].get("prompt_tokens", 0))} if usage else None
        for attempt in range(ACCOUNT_ATTEMPTS):
            try:
                await self.store.add_counts(
                    prepared.tenant,
                    prepared.session,
                    prepared.branch,
                    counts,
                    token=token,
                    latest=latest,
                )
                await self.quotas.record_upstream(prepared.tenant, prompt)
                break
            except StoreUnavailable as exc:
                if attempt + 1 == ACCOUNT_ATTEMPTS:
                    log.warning("accounting of session %r lost: %s", prepared.session, exc)
                    return
                await asyncio.sleep(0.5 * 2**attempt)
        await accounting.record(
            self.store, prepared.tenant, prepared.session, prepared.branch, request
        )
