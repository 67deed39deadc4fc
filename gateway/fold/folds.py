"""ReFold's priced folds: which stale steps to fold when the chunk boundary moves.

A step is a candidate when the model marked it stale (the protocol's STALE line, rule
``protocol``) or a fold operator claimed it (``gateway.fold.operators``: the harness's
task list says it is finished, a later call superseded it), the operator is not stopped
for the session, and no later message refers to it (``gateway.fold.references``). A fold
rewrites outputs the replica already has in its prefix cache, so it is taken only when
its saving, weighted by KV pressure, beats the re-prefill it causes (``pricing.py``); see
``refold.py`` for the rule as a whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

from gateway.fold.pricing import rewrite_pays, rewrite_value
from gateway.fold.protocol import fold_note, fold_pointer
from gateway.fold.references import anchors, refers
from gateway.fold.refold_cache import ReFoldCache
from gateway.fold.renderer import FOLD, RenderState, TokenCount, origin_kind
from gateway.transcript import Message, Transcript

PROTOCOL = "protocol"


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
    rules = candidate_rules(c, history, boundary, now)
    candidates = sorted(
        s
        for s in rules
        if s not in c.folded
        and s not in state.pinned
        and s not in c.index.sources
        and c.tokens[c.steps[s]] > count_tokens(pointer_message(history, c, s))
    )
    best: tuple[float, set[int], dict[int, Message], dict[int, int], int, int] | None = None
    # A folded step's text depends only on its run's ends, which most suffixes share:
    # render and count each (step, run) once, not once per suffix tried.
    seen: dict[tuple[int, int, int], tuple[Message, int]] = {}
    # Each suffix tried re-prefills from its first changed output to ``now``: the shown
    # tokens summed once (``shown[b] - shown[a]`` is ``sum(c.tokens[a:b])``), then
    # corrected by the outputs the suffix changes.
    shown = list(accumulate(c.tokens, initial=0))
    first_shown = next((i for i, m in enumerate(c.out) if m.role != "system"), None)
    restore_joins = not c.restore_offered and bool(history.tools) and not c.text_mode
    # Offering the restore tool prefills its schema (``restore_cost``); where it joins the
    # schemas, every later request carries it too, which comes off the saving (``joined``).
    restore_cost = 0 if c.restore_offered else restore_tool_tokens
    joined = restore_tool_tokens if restore_joins else 0
    for j in range(len(candidates)):
        chosen = set(candidates[j:])
        runs = fold_runs(c.folded | chosen, candidates[j:])
        positions = [c.steps[s] for first, last in runs for s in range(first, last + 1)]
        stub_saved = sum(c.step_stubs.get(s, (0, 0))[1] for s in chosen)
        start = positions[0]
        if restore_joins:
            # The restore tool joins the schemas: all after them is prefilled again, and
            # every later request carries it.
            start = first_shown if first_shown is not None else start
        span = shown[now] - shown[start] if start < now else 0
        # Bounds before rendering anything: a changed output saves at most all its tokens
        # (its folded text costs at least none), so a suffix whose best case does not pay,
        # or does not beat the best so far, is passed over as its rendering would be.
        net_most = sum(c.tokens[p] for p in positions) + stub_saved - joined
        reprefill_least = span - sum(c.tokens[p] for p in positions if start <= p < now)
        reprefill_least += restore_cost
        if not rewrite_pays(net_most, reprefill_least, c.requests, state.pressure) or (
            best is not None
            and rewrite_value(net_most, c.requests, state.pressure) - reprefill_least <= best[0]
        ):
            continue
        renders: dict[int, Message] = {}
        tokens: dict[int, int] = {}
        for first, last in runs:
            for s in range(first, last + 1):
                key = (s, first, last if s == first else first)
                if key not in seen:
                    message = folded_message(c, history, s, first, last, rules)
                    seen[key] = (message, count_tokens(message))
                renders[c.steps[s]], tokens[c.steps[s]] = seen[key]
        if any(_run_grows(c, tokens, run) for run in runs):
            continue  # a note longer than the outputs it stands for
        saved = sum(c.tokens[pos] - n for pos, n in tokens.items()) + stub_saved
        net = saved - joined
        reprefill = span + restore_cost
        reprefill += sum(n - c.tokens[pos] for pos, n in tokens.items() if start <= pos < now)
        if not rewrite_pays(net, reprefill, c.requests, state.pressure):
            continue
        gain = rewrite_value(net, c.requests, state.pressure) - reprefill
        if best is None or gain > best[0]:
            best = (gain, chosen, renders, tokens, saved, reprefill)
    if best is None:
        return
    _, chosen, renders, tokens, saved, reprefill = best
    for pos, message in renders.items():
        rule = c.fold_rule.get(c.step_of[pos]) or rules[c.step_of[pos]][0]
        c.fold_saved_by[rule] = c.fold_saved_by.get(rule, 0) + c.tokens[pos] - tokens[pos]
        c.out[pos] = message
        c.tokens[pos] = tokens[pos]
        c.kinds[pos] = origin_kind(history.messages[pos], message, FOLD)
    for s in chosen:
        rule, note = rules[s]
        c.fold_rule[s] = rule
        c.fold_notes[s] = note
        c.claims.pop(s, None)
        c.anchors.pop(s, None)
        stub_saved = c.step_stubs.get(s, (0, 0))[1]
        c.fold_saved_by[rule] = c.fold_saved_by.get(rule, 0) + stub_saved
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
    c: ReFoldCache,
    history: Transcript,
    step: int,
    first: int,
    last: int,
    rules: dict[int, tuple[str, str | None]],
) -> Message:
    """Step ``step``'s text when the run of folded steps ``first``..``last`` holds it."""
    m = history.messages[c.steps[step]]
    if step == first:
        notes = [
            c.fold_notes[s] if s in c.fold_notes else rules[s][1] for s in range(first, last + 1)
        ]
        return m.with_text(f"[step {first}]\n{fold_note(first, last, notes)}")
    return m.with_text(f"[step {step}]\n{fold_pointer(first)}")


def pointer_message(history: Transcript, c: ReFoldCache, step: int) -> Message:
    """What step ``step`` reads as inside a folded run whose note is at another step."""
    m = history.messages[c.steps[step]]
    return m.with_text(f"[step {step}]\n{fold_pointer(step)}")


def _run_grows(c: ReFoldCache, tokens: dict[int, int], run: tuple[int, int]) -> bool:
    """Whether the folded run ``run`` would take more tokens than it does now."""
    positions = [c.steps[s] for s in range(run[0], run[1] + 1)]
    return sum(tokens[p] for p in positions) >= sum(c.tokens[p] for p in positions)


def candidate_rules(
    c: ReFoldCache, history: Transcript, boundary: int, now: int
) -> dict[int, tuple[str, str | None]]:
    """Steps below ``boundary`` that may be folded as of position ``now``: (rule, note) of
    each. The model's own stale marks come first (their note is its PROGRESS line)."""
    rules: dict[int, tuple[str, str | None]] = {}
    for s, (operator, claim) in c.claims.items():
        if s < boundary and operator not in c.stopped and not referred(c, history, s, now):
            rules[s] = (operator, claim.note)
    for s in c.stale:
        if s < boundary:
            rules[s] = (PROTOCOL, c.progress[s])
    return rules


def referred(c: ReFoldCache, history: Transcript, step: int, now: int) -> bool:
    """Whether a message after step ``step``'s claim point, up to ``now``, refers to it."""
    _, claim = c.claims[step]
    done = c.referred.get(step)
    if done is not None and done[0] == claim.after:
        if done[2] or done[1] >= now:
            return done[2]
        start = done[1] + 1
    else:
        start = claim.after + 1
    said = [c.said[pos] for pos in range(start, now + 1) if pos in c.said]
    found = False
    if said:
        anchor = c.anchors.get(step)
        if anchor is None or anchor[0] != claim.after:
            m = history.messages[c.steps[step]]
            call = c.producers[step]
            arguments = "" if isinstance(call, str) or call is None else call.arguments
            made = anchors(m.text, arguments, m.tool_call_id)
            if claim.fresh is not None:
                made = made.without(anchors(history.messages[c.steps[claim.fresh]].text))
            anchor = c.anchors[step] = (claim.after, made)
        found = any(refers(anchor[1], words) for words in said)
    c.referred[step] = (claim.after, now, found)
    if found:
        c.anchors.pop(step, None)
    return found


def fold_runs(folded: set[int], steps: Sequence[int]) -> list[tuple[int, int]]:
    """The runs of adjacent folded steps holding any of ``steps`` (ascending), each once:
    walked once each, where a walk per step would cost the run's length per step."""
    runs: list[tuple[int, int]] = []
    for s in steps:
        if not runs or s > runs[-1][1]:
            runs.append(fold_run(folded, s))
    return runs


def fold_run(folded: set[int], step: int) -> tuple[int, int]:
    """The first and last step of the run of adjacent folded steps holding ``step``."""
    first = last = step
    while first - 1 in folded:
        first -= 1
    while last + 1 in folded:
        last += 1
    return first, last
