"""ReFold's priced folds: which stale steps to fold when the chunk boundary moves.

A fold rewrites outputs the replica already has in its prefix cache, so it is taken only
when its saving, weighted by KV pressure, beats the re-prefill it causes
(``pricing.py``); see ``refold.py`` for the rule as a whole.
"""

from __future__ import annotations

from gateway.fold.pricing import rewrite_pays, rewrite_value
from gateway.fold.protocol import fold_note, fold_pointer
from gateway.fold.refold_cache import ReFoldCache
from gateway.fold.renderer import FOLD, RenderState, TokenCount, origin_kind
from gateway.transcript import Message, Transcript


def decide_folds(
    c: ReFoldCache,
    history: Transcript,
    state: RenderState,
    boundary: int,
    now: int,
    count_tokens: TokenCount,
    restore_tool_tokens: int,
) -> None:
    """Fold stale steps below ``boundary`` where that pays, as of history position
    ``now`` (the output that moved the boundary; what is before it was sent already).

    Folding a later candidate re-prefills less than folding an earlier one, so the
    choice is the latest-starting set of candidates (all candidates from some step on)
    whose saving beats its re-prefill by the most; earlier ones wait."""
    candidates = sorted(
        s
        for s in c.stale
        if s < boundary and s not in c.folded and s not in state.pinned and s not in c.index.sources
    )
    best: tuple[float, set[int], dict[int, Message], dict[int, int], int, int] | None = None
    # A folded step's text depends only on its run's ends, which most suffixes share:
    # render and count each (step, run) once, not once per suffix tried.
    seen: dict[tuple[int, int, int], tuple[Message, int]] = {}
    for j in range(len(candidates)):
        chosen = set(candidates[j:])
        folded = c.folded | chosen
        changed: set[int] = set()
        for s in chosen:
            first, last = fold_run(folded, s)
            changed.update(range(first, last + 1))
        renders: dict[int, Message] = {}
        tokens: dict[int, int] = {}
        for s in changed:
            first, last = fold_run(folded, s)
            key = (s, first, last if s == first else first)
            if key not in seen:
                message = folded_message(c, history, s, first, last)
                seen[key] = (message, count_tokens(message))
            renders[c.steps[s]], tokens[c.steps[s]] = seen[key]
        saved = sum(c.tokens[pos] - n for pos, n in tokens.items())
        saved += sum(c.step_stubs.get(s, (0, 0))[1] for s in chosen)
        start = min(renders)
        if not c.restore_offered and history.tools and not c.text_mode:
            # The restore tool joins the schemas: all after them is prefilled again.
            start = next((i for i, m in enumerate(c.out) if m.role != "system"), start)
        reprefill = sum(tokens.get(pos, c.tokens[pos]) for pos in range(start, now))
        if not c.restore_offered:
            reprefill += restore_tool_tokens
        if not rewrite_pays(saved, reprefill, c.requests, state.pressure):
            continue
        gain = rewrite_value(saved, c.requests, state.pressure) - reprefill
        if best is None or gain > best[0]:
            best = (gain, chosen, renders, tokens, saved, reprefill)
    if best is None:
        return
    _, chosen, renders, tokens, saved, reprefill = best
    for pos, message in renders.items():
        c.out[pos] = message
        c.tokens[pos] = tokens[pos]
        c.kinds[pos] = origin_kind(history.messages[pos], message, FOLD)
    c.folded |= chosen
    c.index.hidden |= chosen
    for s in chosen:  # a folded step's stubs are gone with its text
        stubs, stub_saved = c.step_stubs.pop(s, (0, 0))
        c.stubs -= stubs
        c.stub_saved -= stub_saved
    c.fold_saved += saved
    c.rewrites += 1
    c.reprefill += reprefill
    c.restore_offered = True


def folded_message(
    c: ReFoldCache, history: Transcript, step: int, first: int, last: int
) -> Message:
    """Step ``step``'s text when the run of folded steps ``first``..``last`` holds it."""
    m = history.messages[c.steps[step]]
    if step == first:
        note = fold_note(first, last, [c.progress[s] for s in range(first, last + 1)])
        return m.with_text(f"[step {first}]\n{note}")
    return m.with_text(f"[step {step}]\n{fold_pointer(first)}")


def fold_run(folded: set[int], step: int) -> tuple[int, int]:
    """The first and last step of the run of adjacent folded steps holding ``step``."""
    first = last = step
    while first - 1 in folded:
        first -= 1
    while last + 1 in folded:
        last += 1
    return first, last
