"""CliffCompaction (Nguyen, Cho, Chen, Dettmers, 2026): never rewrite, only truncate.

The context is left untouched until its token count crosses ``threshold``. Then the
leading system prompt(s) and the first user message stay verbatim, the last ``keep_turns``
assistant-led turns stay verbatim (the kept part starts at an assistant message, so no tool
result loses its call) and everything between becomes ONE user message listing, in order:
user text (capped), assistant text and thinking (capped), tool calls as signatures
(``name(arguments cut to 150 chars)``) and tool results verbatim only when they are at
most 500 characters (longer ones are noted as dropped). Every compaction rebuilds that
message from the original messages, so summaries never nest. When the result is still over
the threshold the ladder continues: keep 1 recent turn, then cap thoughts harder, then cut
the summary oldest-first.

Determinism: the rendering at history length n is defined as the result of applying the
rule at every point where a model request was made, i.e. before every assistant message,
and at n. The cut only moves at a point whose context (as rendered then) crossed the
threshold. The cache holds that state as of the last assistant message and as of the last
call, so a call costs the token counts of what is new (plus a prefix comparison that checks
the cache applies).

``follow`` is the same rule over a sequence of contexts that another renderer made
(``Composed``): when messages before the cached point were rewritten in place (same
places, roles and call ids), the cut and the summary stay and only the rewritten kept
messages are counted again, so a rewrite below the cut changes nothing that is sent. Given
the ``source`` the contexts were rendered from, a following cliff summarises the source's
messages: a cut then costs what it costs the cliff alone (an output the inner shrank below
``result_max`` would otherwise enter the summary verbatim where the cliff alone drops it).

Token count = sum of ``count_tokens`` over the rendered messages; tool schemas are not
counted, so set ``threshold`` below the model window by their size. The render state is
not used: restores and pins are ReFold's, and a cliff summarises whatever lies in its cut.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gateway.fold.baselines import require_int
from gateway.fold.registry import Strategy, register
from gateway.fold.renderer import (
    SUMMARY,
    VERBATIM,
    Rendered,
    Renderer,
    RenderState,
    RenderStats,
    TokenCount,
    estimate_tokens,
    removed_by,
)
from gateway.fold.summary import (
    Candidate,
    Caps,
    SummaryBuilder,
    head_end,
    lines_up,
    rewritten_in_place,
)
from gateway.transcript import Message, Transcript, observation_indices

PAPER_THOUGHT_CAP = 300

_RUNG_NOTES = {
    2: "cliff ladder: kept 1 recent turn",
    3: "cliff ladder: kept 1 recent turn, thoughts capped harder",
    4: "cliff ladder: kept 1 recent turn, thoughts capped harder, summary cut oldest-first",
}


@dataclass(frozen=True, slots=True)
class _State:
    """The compaction state after evaluating the prefix ``messages[:pos]``."""

    pos: int
    cut: int  # history index where the verbatim tail starts
    summary: Message | None  # the one user message standing for messages[head:cut]
    summary_tokens: int
    kept_tokens: int  # tokens of messages[cut:pos]
    compactions: int
    rung: int  # ladder rung that produced the summary (0: none yet)
    recent_turns: tuple[int, ...]  # the last keep_turns assistant indices in [head, pos)
    summarised_tokens: int = 0  # tokens of messages[head:cut], which the summary stands for
    # The largest total any request point up to pos came to, before a compaction there:
    # whether another threshold would have decided the same (``Cliff.carried``).
    peak_tokens: int = 0


@dataclass(frozen=True, slots=True)
class _Cache:
    config: tuple[Any, ...]
    messages: tuple[Message, ...]  # the context of the call that made this cache
    head: int
    head_tokens: int
    committed: _State  # as of the last assistant message (a request point in any extension)
    final: _State  # as of len(messages): a request point once an assistant message follows


def _lower(cap: int | None, limit: int) -> int:
    return limit if cap is None else min(cap, limit)


class Cliff(Renderer):
    name = "cliff"

    def __init__(
        self,
        threshold: int,
        keep_turns: int = 3,
        user_cap: int = 20_000,
        assistant_cap: int | None = 2_000,
        thinking_cap: int | None = 2_000,
        call_arg_cap: int = 150,
        result_max: int = 500,
        hard_thought_cap: int = 100,
        count_tokens: TokenCount = estimate_tokens,
    ) -> None:
        require_int("threshold", threshold, 1)
        require_int("keep_turns", keep_turns, 1)
        for name, value in (
            ("user_cap", user_cap),
            ("call_arg_cap", call_arg_cap),
            ("result_max", result_max),
            ("hard_thought_cap", hard_thought_cap),
        ):
            require_int(name, value)
        for name, cap in (("assistant_cap", assistant_cap), ("thinking_cap", thinking_cap)):
            if cap is not None:  # None: uncapped
                require_int(name, cap)
        self.threshold = threshold
        self.keep_turns = keep_turns
        self.user_cap = user_cap
        self.call_arg_cap = call_arg_cap
        self.result_max = result_max
        self.count_tokens = count_tokens
        self._caps = Caps(assistant_cap, thinking_cap)
        # The ladder's "cap thoughts harder": assistant text and thinking both go down to it.
        self._hard_caps = Caps(
            _lower(assistant_cap, hard_thought_cap), _lower(thinking_cap, hard_thought_cap)
        )
        # A cache made under other parameters is not reused (but see ``carried``).
        self._config: tuple[Any, ...] = (
            threshold,
            keep_turns,
            user_cap,
            self._caps,
            self._hard_caps,
            call_arg_cap,
            result_max,
            count_tokens,
        )

    @classmethod
    def paper(cls, threshold: int, **options: Any) -> Cliff:
        """The paper's algorithm: assistant text and thinking capped at 300 characters."""
        options.setdefault("assistant_cap", PAPER_THOUGHT_CAP)
        options.setdefault("thinking_cap", PAPER_THOUGHT_CAP)
        return cls(threshold, **options)

    def render(
        self, history: Transcript, state: RenderState | None = None, cache: Any = None
    ) -> Rendered:
        new_cache, head_tokens, final = self._evaluate(history.messages, cache, False, ())
        return self._rendered(history, new_cache, head_tokens, final, final.compactions)

    def follow(
        self, context: Transcript, cache: Any = None, source: Sequence[Message] = ()
    ) -> Rendered:
        """``render`` for the next request of a session whose earlier contexts ``cache``
        saw, where another renderer may since have rewritten earlier messages in place.

        Given the ``source`` the context was rendered from, place for place (same length,
        roles and call ids), the cliff decides on the source: it compacts where, and as,
        the cliff alone compacts that history, and sends the context's messages from the
        cut on. So a request never holds more than the cliff alone sends whenever the
        inner renders no message longer than it is: its kept part is the inner's, its head
        and summary the cliff's. (Counting the shrunk kept part instead postpones
        compactions, and a postponed compaction keeps the context near the budget for
        requests the cliff alone sends compacted: on two recorded runs that sent more in
        total than the cliff alone.) Without a source that lines up, the compaction state
        carries over in-place rewrites: the cut and the summary stay (a rewrite inside the
        summarised part changes nothing that is sent) and the kept messages are counted as
        they read now. A context whose earlier messages moved, changed role or call ids,
        or a cache made with other parameters, is evaluated from its start.
        """
        source = tuple(source)
        if lines_up(source, context.messages):
            new_cache, head_tokens, final = self._evaluate(source, cache, False, ())
            return self._rendered(context, new_cache, head_tokens, final, final.compactions)
        new_cache, head_tokens, final = self._evaluate(
            context.messages, cache, follow=True, source=source
        )
        return self._rendered(context, new_cache, head_tokens, final, final.compactions)

    def carried(self, cache: Any) -> Any:
        """``cache``, made by a cliff that differs from this one in its threshold alone, as
        this cliff would have made it over the same calls; None where it might differ.

        Where no request point the cache evaluated came above either threshold, neither
        cliff tried a compaction anywhere, and nothing else it keeps depends on the
        threshold: the states are the same. The context guard gives a session a new
        threshold whenever its calibration moves, which would otherwise evaluate the
        whole history again (``Composed``): tens of milliseconds late in a long session,
        for a session still far from its window."""
        if not isinstance(cache, _Cache) or cache.config[1:] != self._config[1:]:
            return None
        if cache.final.peak_tokens > min(cache.config[0], self.threshold):
            return None
        return replace(cache, config=self._config)

    def compact_for_overflow(
        self,
        history: Transcript,
        state: RenderState | None = None,
        cache: Any = None,
        *,
        follow: bool = False,
        source: Sequence[Message] = (),
    ) -> Iterator[Rendered]:
        """Successively smaller renderings for a provider's "context too long" error.

        Walks the ladder from a forced compaction, whatever the threshold says: keep
        ``keep_turns`` turns, keep 1, cap thoughts harder, cut half the summary, cut all of
        it. Only renderings smaller than the one before are yielded; the gateway retries
        with each until one is accepted. The forced compaction is not part of the history's
        state (the returned cache is the normal one): if it keeps happening, the threshold
        is above the model's real window. ``follow`` and ``source``: as ``follow`` takes them.
        """
        messages = history.messages
        source = tuple(source)
        if follow and lines_up(source, messages):
            # Decided on the source, as ``follow`` decides; the kept part is the context's.
            messages, follow, source = source, False, ()
        new_cache, head_tokens, current = self._evaluate(messages, cache, follow, source)
        head = head_end(messages)
        best = head_tokens + current.summary_tokens + current.kept_tokens
        for candidate in self._overflow_rungs(messages, source, head, current):
            total = candidate.total(head_tokens)
            if total >= best:
                continue
            best = total
            forced = self._adopt(current, candidate)
            yield self._rendered(history, new_cache, head_tokens, forced, current.compactions + 1)

    # -- evaluation ---------------------------------------------------------------------

    def _evaluate(
        self,
        messages: tuple[Message, ...],
        cache: Any,
        follow: bool,
        source: tuple[Message, ...],
    ) -> tuple[_Cache, int, _State]:
        """(cache to hand back, head tokens, state at len(messages))."""
        head = head_end(messages)
        resumed = self._resume(cache, messages, head, follow)
        if resumed is None:
            head_tokens = sum(self.count_tokens(m) for m in messages[:head])
            state = _State(head, head, None, 0, 0, 0, 0, ())
        else:
            head_tokens, state = resumed
        for j in range(state.pos + 1, len(messages)):
            if messages[j].role == "assistant":
                state = self._advance(messages, source, head, head_tokens, state, j)
        final = self._advance(messages, source, head, head_tokens, state, len(messages))
        return _Cache(self._config, messages, head, head_tokens, state, final), head_tokens, final

    def _resume(
        self, cache: Any, messages: tuple[Message, ...], head: int, follow: bool
    ) -> tuple[int, _State] | None:
        if not isinstance(cache, _Cache) or cache.config != self._config or cache.head != head:
            return None
        seen = cache.messages
        # The last call's point is a request point of this context once a reply follows it.
        extends = len(messages) > len(seen) and messages[len(seen)].role == "assistant"
        state = cache.final if extends else cache.committed
        pos = state.pos
        if pos > len(messages):
            return None
        if messages[:pos] == seen[:pos]:
            return cache.head_tokens, state
        if not follow or not rewritten_in_place(messages[:pos], seen[:pos]):
            return None  # another branch, or a history whose prefix was rewritten
        return self._rebase(cache, messages, state)

    def _rebase(
        self, cache: _Cache, messages: tuple[Message, ...], state: _State
    ) -> tuple[int, _State]:
        """``state`` over ``messages``, whose first ``state.pos`` messages were rewritten in
        place: the head and the kept messages are counted as they read now; the summarised
        ones are no longer sent, so the cut and the summary stay."""
        seen, head = cache.messages, cache.head
        head_tokens = cache.head_tokens
        if messages[:head] != seen[:head]:
            head_tokens = sum(self.count_tokens(m) for m in messages[:head])
        kept = state.kept_tokens
        span = slice(state.cut, state.pos)
        for now, was in zip(messages[span], seen[span], strict=True):
            if now is not was and now != was:
                kept += self.count_tokens(now) - self.count_tokens(was)
        return head_tokens, replace(state, kept_tokens=kept)

    def _advance(
        self,
        messages: tuple[Message, ...],
        source: tuple[Message, ...],
        head: int,
        head_tokens: int,
        state: _State,
        p: int,
    ) -> _State:
        """Move the state to the point ``p`` (a request over ``messages[:p]``)."""
        new = messages[state.pos : p]
        turns = state.recent_turns + tuple(
            state.pos + i for i, m in enumerate(new) if m.role == "assistant"
        )
        kept = state.kept_tokens + sum(self.count_tokens(m) for m in new)
        total = head_tokens + state.summary_tokens + kept
        state = replace(
            state,
            pos=p,
            kept_tokens=kept,
            recent_turns=turns[-self.keep_turns :],
            peak_tokens=max(state.peak_tokens, total),
        )
        if total <= self.threshold:
            return state
        return self._adopt(state, self._compact(messages, source, head, head_tokens, state))

    def _adopt(self, state: _State, candidate: Candidate) -> _State:
        changed = candidate.cut != state.cut or candidate.summary != state.summary
        return replace(
            state,
            summarised_tokens=state.summarised_tokens + state.kept_tokens - candidate.kept_tokens,
            cut=candidate.cut,
            summary=candidate.summary,
            summary_tokens=candidate.summary_tokens,
            kept_tokens=candidate.kept_tokens,
            rung=candidate.rung if changed else state.rung,
            compactions=state.compactions + changed,
        )

    # -- the ladder ---------------------------------------------------------------------

    def _cuts(self, state: _State) -> tuple[int, int]:
        """Cuts that keep ``keep_turns`` turns and 1 turn; never before the current cut."""
        turns = state.recent_turns
        if not turns:
            return state.cut, state.cut
        return max(state.cut, turns[0]), max(state.cut, turns[-1])

    def _compact(
        self,
        messages: tuple[Message, ...],
        source: tuple[Message, ...],
        head: int,
        head_tokens: int,
        state: _State,
    ) -> Candidate:
        """The first rung that fits under the threshold, else the most aggressive one."""
        builder = SummaryBuilder(self, messages, source, head, state.cut, state.pos)
        cut_k, cut_1 = self._cuts(state)
        for rung, cut, caps in ((1, cut_k, self._caps), (2, cut_1, self._caps)):
            candidate = builder.candidate(rung, cut, caps, 0)
            if candidate.total(head_tokens) <= self.threshold:
                return candidate
        entries = builder.entries(cut_1, self._hard_caps)
        # Rung 3 is rung 4 with nothing dropped: find the fewest oldest entries to drop.
        lo, hi = 0, len(entries)
        while lo < hi:
            mid = (lo + hi) // 2
            candidate = builder.candidate(4 if mid else 3, cut_1, self._hard_caps, mid)
            if candidate.total(head_tokens) <= self.threshold:
                hi = mid
            else:
                lo = mid + 1
        return builder.candidate(4 if lo else 3, cut_1, self._hard_caps, lo)

    def _overflow_rungs(
        self, messages: tuple[Message, ...], source: tuple[Message, ...], head: int, state: _State
    ) -> Iterator[Candidate]:
        builder = SummaryBuilder(self, messages, source, head, state.cut, state.pos)
        cut_k, cut_1 = self._cuts(state)
        yield builder.candidate(1, cut_k, self._caps, 0)
        yield builder.candidate(2, cut_1, self._caps, 0)
        yield builder.candidate(3, cut_1, self._hard_caps, 0)
        count = len(builder.entries(cut_1, self._hard_caps))
        yield builder.candidate(4, cut_1, self._hard_caps, count // 2)
        yield builder.candidate(4, cut_1, self._hard_caps, count)

    # -- output -------------------------------------------------------------------------

    def _rendered(
        self, history: Transcript, cache: _Cache, head_tokens: int, state: _State, compactions: int
    ) -> Rendered:
        messages = history.messages
        head = cache.head
        out = list(messages[:head])
        summary = () if state.summary is None else (state.summary,)
        out.extend(summary)
        out.extend(messages[state.cut :])
        kept = len(messages) - state.cut
        sources = (*range(head), *(None for _ in summary), *range(state.cut, len(messages)))
        kinds = (VERBATIM,) * head + (SUMMARY,) * len(summary) + (VERBATIM,) * kept
        observations = observation_indices(messages)
        total = head_tokens + state.summary_tokens + state.kept_tokens
        stats = RenderStats(
            steps=len(observations),
            boundary=sum(1 for i in observations if i < state.cut),
            compactions=compactions,
            notes=(_RUNG_NOTES[state.rung],) if state.rung in _RUNG_NOTES else (),
            over_budget=total > self.threshold,
            removed=removed_by((("compaction", state.summarised_tokens - state.summary_tokens),)),
        )
        return Rendered(history.with_messages(out), cache, stats, sources, kinds)


register(
    Strategy(
        "cliff",
        Cliff,
        settings=lambda s: {"threshold": s.budget, "count_tokens": s.count_tokens},
        needs_budget=True,
        # It keeps its last context's messages and its running token counts (measured).
        cache_bytes_per_text_byte=0.8,
    )
)
