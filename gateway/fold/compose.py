"""Two renderers in a row: the paper's budgeted setting ``refold+cliff``.

``Composed(inner, outer)`` renders the history with ``inner``, then gives ``outer`` the
inner's rendered transcript *as its history*. With a ``Cliff`` outside, the outer only
compacts once the inner's rendering still crosses its budget.

Caveats, because the outer works on the inner's rendering:
- The outer gets no render state: restore indices and pins name history positions, which
  mean nothing in the inner's rendering. An outer cliff may therefore summarise restored
  content or pinned steps that the inner kept in full.
- The inner's labels and stubs (``[step N]``, fold notes, dedup stubs) are plain text to
  the outer; a restore the model asks for still works because it reads the real history.

An outer that can ``follow`` (``Cliff``) is given the history each context was rendered
from: the composition is defined as the outer's rule applied at every request point of the
history (before each assistant message, and at its end). When the inner renders the
history place for place (same places, roles and call ids: ReFold's stubs and folds), the
cliff compacts where and as the cliff alone compacts the history (same cut, same summary)
and sends the inner's rendering of the kept part. So ``refold+cliff`` never sends more
than ``cliff`` in a request where no kept message renders longer than it is (ReFold's
stubs and folds are only taken when shorter; its protocol labels, in fold mode ``on``, are
the exception). Letting the inner's savings postpone the compaction instead sends more in
total: the postponed requests sit near the budget where the cliff alone has compacted
(two recorded runs, docs/refold.md). An inner that does not keep places (a system message
added in front) is followed over its own rendering: its rewrites in place keep the cut and
the summary, and the kept messages are counted as they read now. The cache holds the
history it was made for; a history that does not extend it (or a cache made by another
composition) is replayed point by point.

Any other outer is applied to the inner's rendering of the whole history, as it stands.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

from gateway.fold.renderer import (
    LABELLED,
    VERBATIM,
    Rendered,
    Renderer,
    RenderState,
    RenderStats,
    removed_by,
)
from gateway.transcript import Message, Transcript


@runtime_checkable
class Follower(Protocol):
    """An outer whose state carries over contexts the inner rewrote (see ``Cliff.follow``)."""

    def follow(
        self, context: Transcript, cache: Any = None, source: Sequence[Message] = ()
    ) -> Rendered: ...

    def carried(self, cache: Any) -> Any:
        """A cache another outer of its kind made, as this one would have made it; None
        where it might differ (see ``Cliff.carried``)."""

    def compact_for_overflow(
        self,
        history: Transcript,
        state: RenderState | None = None,
        cache: Any = None,
        *,
        follow: bool = False,
        source: Sequence[Message] = (),
    ) -> Iterator[Rendered]: ...


@dataclass(frozen=True, slots=True)
class _Points:
    """A following composition's cache: both caches as of the last request point."""

    owner: Composed  # the composition that made it: another takes it only as ``carried``
    history: tuple[Message, ...]  # the history of that point
    inner: Any
    outer: Any


class Composed(Renderer):
    """``outer`` applied to what ``inner`` rendered; the cache is the pair of their caches."""

    def __init__(self, inner: Renderer, outer: Renderer) -> None:
        for role, part in (("inner", inner), ("outer", outer)):
            if not isinstance(part, Renderer):
                raise TypeError(f"Composed {role} must be a Renderer, got {type(part).__name__}")
        self.inner = inner
        self.outer = outer
        # An instance attribute: a composition's name depends on its parts.
        self.name = f"{inner.name}+{outer.name}"  # type: ignore[misc]

    def render(
        self, history: Transcript, state: RenderState | None = None, cache: Any = None
    ) -> Rendered:
        if not isinstance(self.outer, Follower):
            inner_cache, outer_cache = cache if cache is not None else (None, None)
            first = self.inner.render(history, state, inner_cache)
            second = self.outer.render(first.transcript, None, outer_cache)
            return joined(first, second, (first.cache, second.cache))
        first, outer_cache = self._points(self.outer, history, state, cache)
        second = self.outer.follow(first.transcript, outer_cache, history.messages)
        return joined(first, second, _Points(self, history.messages, first.cache, second.cache))

    def compact_for_overflow(
        self, history: Transcript, state: RenderState | None = None, cache: Any = None
    ) -> Iterator[Rendered]:
        """The outer's overflow ladder over the inner's rendering (nothing if it has none)."""
        if isinstance(self.outer, Follower):
            first, outer_cache = self._points(self.outer, history, state, cache)
            ladder = self.outer.compact_for_overflow(
                first.transcript, None, outer_cache, follow=True, source=history.messages
            )
            for second in ladder:
                yield joined(
                    first, second, _Points(self, history.messages, first.cache, second.cache)
                )
            return
        outer_ladder = getattr(self.outer, "compact_for_overflow", None)
        if outer_ladder is None:
            return
        inner_cache, outer_cache = cache if cache is not None else (None, None)
        first = self.inner.render(history, state, inner_cache)
        for second in outer_ladder(first.transcript, None, outer_cache):
            yield joined(first, second, (first.cache, second.cache))

    def _points(
        self, outer: Follower, history: Transcript, state: RenderState | None, cache: Any
    ) -> tuple[Rendered, Any]:
        """The inner's rendering of ``history`` and the outer's cache as of the request
        point before it: the outer follows the inner at every point ``cache`` has not seen."""
        messages = history.messages
        inner_cache, outer_cache, start = None, None, 0
        if isinstance(cache, _Points) and messages[: len(cache.history)] == cache.history:
            if cache.owner is self:
                inner_cache, outer_cache = cache.inner, cache.outer
                start = len(cache.history) + 1
            elif cache.owner.inner is self.inner:
                # Another outer over the same inner (the guard's new threshold): the inner's
                # renderings stand; the outer's state carries over where it is the same.
                carried = outer.carried(cache.outer)
                if carried is not None:
                    inner_cache, outer_cache = cache.inner, carried
                    start = len(cache.history) + 1
        for point in range(start, len(messages)):
            if messages[point].role != "assistant":
                continue
            source = messages[:point]
            earlier = self.inner.render(
                history.with_messages(source), _before(state, point), inner_cache
            )
            outer_cache = outer.follow(earlier.transcript, outer_cache, source).cache
            inner_cache = earlier.cache
        return self.inner.render(history, state, inner_cache), outer_cache


def _before(state: RenderState | None, point: int) -> RenderState | None:
    """The render state of the request at ``point``: the restores made before it."""
    if state is None:
        return None
    return replace(state, restored=frozenset(i for i in state.restored if i < point))


def joined(first: Rendered, second: Rendered, cache: Any) -> Rendered:
    """``second``, made over ``first``'s rendering, traced back to ``first``'s history: a
    message ``second`` kept as it was is what ``first`` made of it. Untraced (empty
    origins) when either part reports none."""
    inner_sources, inner_kinds = first.sources, first.kinds
    if len(inner_sources) != len(first.transcript.messages):
        return Rendered(second.transcript, cache, merge_stats(first, second))
    sources = tuple(None if s is None else inner_sources[s] for s in second.sources)
    kinds = tuple(
        inner_kinds[s] if s is not None and k in (VERBATIM, LABELLED) else k
        for s, k in zip(second.sources, second.kinds, strict=True)
    )
    return Rendered(second.transcript, cache, merge_stats(first, second), sources, kinds)


def merge_stats(first: Rendered, second: Rendered) -> RenderStats:
    """Step counts and boundary from the inner (they name history steps); work adds up."""
    a, b = first.stats, second.stats
    return replace(
        a,
        stubs=a.stubs + b.stubs,
        folded_steps=a.folded_steps + b.folded_steps,
        compactions=a.compactions + b.compactions,
        reminders=a.reminders + b.reminders,
        notes=a.notes + b.notes,
        over_budget=a.over_budget or b.over_budget,
        overhead_tokens=a.overhead_tokens + b.overhead_tokens,
        stub_saved_tokens=a.stub_saved_tokens + b.stub_saved_tokens,
        fold_saved_tokens=a.fold_saved_tokens + b.fold_saved_tokens,
        rewrites=a.rewrites + b.rewrites,
        reprefill_tokens=a.reprefill_tokens + b.reprefill_tokens,
        restore_tool=a.restore_tool or b.restore_tool,
        text_restores=a.text_restores or b.text_restores,
        removed=removed_by(a.removed, b.removed),
        undone_folds=a.undone_folds + b.undone_folds,
        stopped_rules=tuple(sorted({*a.stopped_rules, *b.stopped_rules})),
    )
