"""Two renderers in a row: the paper's budgeted setting ``refold+cliff``.

``Composed(inner, outer)`` renders the history with ``inner``, then gives ``outer`` the
inner's rendered transcript *as its history*. With a ``Cliff`` outside, the outer only
compacts once the inner's rendering still crosses its budget.

Caveats, because the outer never sees the real history:
- The outer gets no render state: restore indices and pins name history positions, which
  mean nothing in the inner's rendering. An outer cliff may therefore summarise restored
  content or pinned steps that the inner kept in full.
- The inner's labels and stubs (``[step N]``, fold notes, dedup stubs) are plain text to
  the outer; a cliff summary keeps them only as far as its caps and 500-character rule
  allow, and a restore the model asks for still works because it reads the real history.
- When the inner rewrites its prefix (ReFold moves its boundary every k steps), the outer's
  history changed, so its cache no longer applies and it replays over the new rendering.
  Its state (a cliff's cut and compaction count) is then defined as if the new rendering
  had been the history all along: deterministic, but not what earlier requests were sent.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from gateway.fold.renderer import Rendered, Renderer, RenderState, RenderStats
from gateway.transcript import Transcript


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
        inner_cache, outer_cache = cache if cache is not None else (None, None)
        first = self.inner.render(history, state, inner_cache)
        second = self.outer.render(first.transcript, None, outer_cache)
        return Rendered(second.transcript, (first.cache, second.cache), merge_stats(first, second))

    def compact_for_overflow(
        self, history: Transcript, state: RenderState | None = None, cache: Any = None
    ) -> Iterator[Rendered]:
        """The outer's overflow ladder over the inner's rendering (nothing if it has none)."""
        ladder = getattr(self.outer, "compact_for_overflow", None)
        if ladder is None:
            return
        inner_cache, outer_cache = cache if cache is not None else (None, None)
        first = self.inner.render(history, state, inner_cache)
        for second in ladder(first.transcript, None, outer_cache):
            yield Rendered(
                second.transcript, (first.cache, second.cache), merge_stats(first, second)
            )


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
    )
