"""Render: the request's strategy over its history, with the session's renderer cache.

Renderers are pure (``gateway.fold``); what one keeps between a session's requests (its
``cache``: the compressed prefix before the chunk boundary) lives here, per (tenant,
session, branch, strategy), in an LRU bounded by the memory its entries keep alive
(``cache_memory``). Beside it the cache entry keeps how much rewrite re-prefill the session
has already reported, so the metric counts each rewrite once, when the renderer takes it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from gateway import metrics
from gateway.config import GatewayConfig
from gateway.context_guard import ContextGuard
from gateway.dialects.anthropic_context import CONTEXT_MANAGEMENT, parse_context_management
from gateway.dialects.errors import DialectError
from gateway.dialects.fields import ANTHROPIC, DIALECT_PARAM
from gateway.fold.context_edits import apply_context_edits
from gateway.fold.renderer import Renderer
from gateway.fold.spec import StrategySpec, parse_spec
from gateway.lru import LRU
from gateway.steps.render_call import RenderCall
from gateway.tokens import BYTES_PER_TOKEN, TokenCount, estimate_tokens
from gateway.transcript import Transcript

# An entry of a strategy without a cache: its key and bookkeeping (measured ~400 B).
CACHE_ENTRY_BYTES = 512


def calibrated(count_tokens: TokenCount, ratio: float | None) -> TokenCount:
    """``count_tokens`` scaled by ``ratio`` (the replicas' tokens per counted token)."""
    if ratio is None:
        return count_tokens
    return lambda message: round(count_tokens(message) * ratio)


def cache_memory(strategy: str | StrategySpec, history_tokens: int, messages: int = 0) -> int:
    """What the LRU charges for a session's renderer cache: its estimated memory, in bytes,
    for a history of ``messages`` messages of ``history_tokens`` estimated tokens (each
    strategy registers what its cache keeps per byte of history text and per message; a
    composition keeps each part's cache)."""
    spec = parse_spec(strategy)
    return (
        CACHE_ENTRY_BYTES
        + messages * spec.cache_bytes_per_message
        + int(history_tokens * BYTES_PER_TOKEN * spec.cache_bytes_per_text_byte)
    )


@dataclass(frozen=True, slots=True)
class _SessionRender:
    cache: Any  # the renderer's own
    reprefill_tokens: int  # rewrite re-prefill already counted in the metric


class Render:
    def __init__(
        self, config: GatewayConfig, guard: ContextGuard, pressure: Callable[[], float]
    ) -> None:
        self.config = config
        self.guard = guard
        self.pressure = pressure
        self._sessions: LRU[_SessionRender] = LRU(
            config.render_cache_bytes, **metrics.cache_callbacks("render")
        )

    def spec(self, text: str | StrategySpec) -> StrategySpec:
        """The strategy spec ``text`` names; one that names none is the client's error (a
        400 naming the strategy header)."""
        try:
            return parse_spec(text)
        except ValueError as exc:
            raise DialectError(str(exc), param=self.config.strategy_header) from exc

    def renderer(
        self,
        tenant: str,
        strategy: str | StrategySpec,
        fold: str | None = None,
        budget: int | None = None,
    ) -> Renderer:
        """The ``tenant``'s renderer for ``strategy``; ``fold`` (ReFold's fold mode) defaults to the
        config's and only matters when the strategy contains refold; ``budget`` (a tenant's)
        to the config's. An unknown strategy or fold mode is the client's error (a 400
        naming the header)."""
        spec = self.spec(strategy)
        fold = fold or self.config.fold
        budget = self.config.budget if budget is None else budget
        try:
            return self.guard.renderers.get(tenant, spec, fold, budget)
        except ValueError as exc:
            header = self.config.strategy_header
            if "fold mode" in str(exc):
                header = self.config.fold_header
            raise DialectError(str(exc), param=header) from exc

    def __call__(self, prepared: RenderCall) -> tuple[Transcript, int]:
        """The rendered transcript and its token estimate."""
        session = (prepared.tenant, prepared.session)
        # A tenant's own budget replaces the guard's window-derived one.
        guarded = (
            self.guard.renderer(session, prepared.strategy, prepared.transcript, prepared.fold)
            if prepared.budget is None
            else None
        )
        renderer = guarded or self.renderer(
            prepared.tenant, prepared.strategy, prepared.fold, prepared.budget
        )
        # The branch the history is (or will be) stored on; a new one starts without a cache.
        branch = prepared.branch if prepared.branch is not None else prepared.found.branch
        key = (prepared.tenant, prepared.session, branch, prepared.strategy)
        kept = self._sessions.get(key) if branch is not None else None
        started = time.perf_counter()
        prepared.pressure = self.pressure()
        rendered = renderer.render(
            prepared.transcript.with_messages(prepared.history),
            replace(prepared.state, pressure=prepared.pressure),
            kept.cache if kept is not None else None,
        )
        transcript, stats = rendered.transcript, rendered.stats
        params = prepared.transcript.params
        edits = params.get(CONTEXT_MANAGEMENT) if params.get(DIALECT_PARAM) == ANTHROPIC else None
        if edits is not None:
            # Anthropic's context editing, on the strategy's rendering (checked at decode),
            # counted in the replicas' tokens as far as the session's replies calibrate them.
            edited = apply_context_edits(
                transcript,
                prepared.transcript.with_messages(prepared.history),
                prepared.state,
                parse_context_management(edits),
                calibrated(estimate_tokens, self.guard.prompt_ratio(session)),
                stats.restore_tool,
            )
            transcript, prepared.applied_edits = edited.transcript, edited.applied
            stats = replace(stats, restore_tool=edited.restore_tool)
        metrics.RENDER_SECONDS.observe(time.perf_counter() - started)
        metrics.STUBS.inc(stats.stubs)
        metrics.FOLDS.inc(stats.folded_steps)
        metrics.RENDER_TOKENS.labels(kind="added").inc(stats.overhead_tokens)
        metrics.RENDER_TOKENS.labels(kind="removed_by_stubs").inc(stats.stub_saved_tokens)
        metrics.RENDER_TOKENS.labels(kind="removed_by_folds").inc(stats.fold_saved_tokens)
        # Rewrites are counted once, when the session's renderer takes them.
        reprefill = stats.reprefill_tokens - (kept.reprefill_tokens if kept is not None else 0)
        if reprefill > 0:
            metrics.RENDER_TOKENS.labels(kind="reprefilled_by_rewrites").inc(reprefill)
        prepared.stats = stats
        tokens = prepared.memo.tokens(transcript.messages)
        prepared.render_cache = _SessionRender(rendered.cache, stats.reprefill_tokens)
        if prepared.branch is not None:
            self.keep(prepared)
        self.guard.rendered(session, tokens, compacted=stats.compactions > 0)
        return transcript, tokens

    def keep(self, prepared: RenderCall) -> None:
        """Keep the request's renderer cache for the session's next request, under the
        branch its history was stored on (``commit``): a request the upstream never
        accepted leaves the session's cache as it was."""
        if prepared.render_cache is not None and prepared.branch is not None:
            key = (prepared.tenant, prepared.session, prepared.branch, prepared.strategy)
            charge = cache_memory(prepared.strategy, prepared.raw_tokens, len(prepared.history))
            self._sessions.put(key, prepared.render_cache, charge)
