"""The one plug point for context strategies.

A renderer turns the stored history into the context the model sees. It is a pure function
of (history, render state, parameters): no I/O, no clock, same input -> same output. The
optional ``cache`` it returns is a value the caller keeps per session and passes back on
the next call so that the work done is proportional to what is new; rendering without a
cache gives exactly the same transcript.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

# The token-count interface renderers take is the ground floor's (re-exported here).
from gateway.tokens import TokenCount as TokenCount
from gateway.tokens import estimate_tokens as estimate_tokens
from gateway.transcript import Message, Transcript, observation_indices


@dataclass(frozen=True, slots=True)
class RenderState:
    """What only the gateway knows about a session.

    ``restored``: history indices of the gateway-made messages that carry restored content;
    they are rendered verbatim, are not steps, and are never compressed again.
    ``pinned``: steps that must always render in full.
    """

    restored: frozenset[int] = frozenset()
    pinned: frozenset[int] = frozenset()
    # KV-cache pressure on the replica that will serve the request (vLLM's
    # kv_cache_usage_perc, 0-1): it raises the value of a token removed from the context
    # (see ``gateway.fold.pricing``). Not history: a rendering made under other pressure
    # may have taken other rewrite decisions.
    pressure: float = 0.0


@dataclass(frozen=True, slots=True)
class RenderStats:
    steps: int = 0
    boundary: int = 0
    stubs: int = 0
    folded_steps: int = 0
    compactions: int = 0
    reminders: int = 0
    notes: tuple[str, ...] = ()
    # True when the rendering is still over the strategy's token budget (cliff's ladder ran out).
    over_budget: bool = False
    # Where the tokens go, in ``count_tokens`` units, for this rendering: what the strategy
    # added (protocol text, labels, notes, its tool), and what its stubs and folds removed.
    overhead_tokens: int = 0
    stub_saved_tokens: int = 0
    fold_saved_tokens: int = 0
    # Rewrites of already-sent context the strategy chose so far, and the tokens they made
    # the replica prefill again (the strategy's estimate when it priced them).
    rewrites: int = 0
    reprefill_tokens: int = 0
    # How this rendering offers restores, so that only a restore the gateway offered is
    # answered by it: the name of the restore tool it added (None: none added), and whether
    # a text harness was told it may write ``restore N``.
    restore_tool: str | None = None
    text_restores: bool = False
    # What each operator removed from this rendering, in ``count_tokens`` units: ReFold's
    # "dedup" stubs and its folds by rule ("protocol", or a fold operator's name), a
    # cliff's "compaction" (what it summarised, less the summary). Name order.
    removed: tuple[tuple[str, int], ...] = ()
    # ReFold: folds the model undid by restoring them, and the rules stopped for the
    # session because of it (``gateway.fold.operators.STRIKES``).
    undone_folds: int = 0
    stopped_rules: tuple[str, ...] = ()


# What a rendered message is, for the inspector: the history message as it is, or with all
# its content kept and a label or note added; ReFold's stub or fold; a cliff's summary;
# mask's and clip's rewrites; any other strategy's rewrite; a message the strategy added.
VERBATIM = "verbatim"
LABELLED = "labelled"
STUB = "stub"
FOLD = "fold"
SUMMARY = "summary"
MASKED = "masked"
CLIPPED = "clipped"
REWRITTEN = "rewritten"
ADDED = "added"


@dataclass(frozen=True, slots=True)
class Rendered:
    """A rendering. ``sources``: for each rendered message, the history index it renders
    (None: the strategy added it); ``kinds``: what it is (``VERBATIM`` ... ``ADDED``)."""

    transcript: Transcript
    cache: Any = None
    stats: RenderStats = field(default_factory=RenderStats)
    sources: tuple[int | None, ...] = ()
    kinds: tuple[str, ...] = ()


class Renderer(ABC):
    """Subclasses set ``name`` and implement ``render``; parameters go to ``__init__``."""

    name: ClassVar[str]

    @abstractmethod
    def render(
        self, history: Transcript, state: RenderState | None = None, cache: Any = None
    ) -> Rendered: ...


def removed_by(*parts: tuple[tuple[str, int], ...]) -> tuple[tuple[str, int], ...]:
    """``RenderStats.removed`` of several parts, added up by operator (zeros left out)."""
    total: dict[str, int] = {}
    for part in parts:
        for name, tokens in part:
            total[name] = total.get(name, 0) + tokens
    return tuple(sorted((name, n) for name, n in total.items() if n))


def step_indices(history: Transcript, state: RenderState | None = None) -> list[int]:
    """History indices of the steps (tool outputs), gateway-restored content excluded."""
    restored = state.restored if state else frozenset()
    return [i for i in observation_indices(history.messages) if i not in restored]


def keeps_content(original: Message, rendered: Message) -> bool:
    """``rendered`` still holds all of ``original``'s text, thinking and calls."""
    return (
        original.text in rendered.text
        and original.thinking == rendered.thinking
        and original.tool_calls == rendered.tool_calls
    )


def origin_kind(original: Message, rendered: Message, rewritten: str) -> str:
    """The kind of ``rendered``, which renders ``original``: ``VERBATIM``, ``LABELLED``
    (content kept), else the strategy's kind of rewrite ``rewritten``."""
    if rendered is original or rendered == original:
        return VERBATIM
    return LABELLED if keeps_content(original, rendered) else rewritten


def noted_kind(kind: str) -> str:
    """The kind of a message of kind ``kind`` with a note appended to its text."""
    return LABELLED if kind in (VERBATIM, LABELLED) else kind


def verbatim(history: Transcript) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """``sources`` and ``kinds`` of a rendering that is ``history`` itself."""
    n = len(history.messages)
    return tuple(range(n)), (VERBATIM,) * n
