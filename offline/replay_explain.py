"""``foldgate replay --explain N``: what each strategy did to one request, and why.

Request N of a session is rendered as the replay renders it (every request before it
through the same renderer and its cache), then every rendered message that is not the
history's own is listed: stubbed, folded or summarised, its tokens before and after, and
the line that stands in its place, which says why (a stub names the step holding the
content, a fold note the rule and the harness's words, a summary what it stands for).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.fold.renderer import LABELLED, SUMMARY, VERBATIM, Renderer
from gateway.tokens import ChatTokenizer
from offline.replay import TrajectoryLike, requests_of

# Every kind of rendered message but the history's own (as is, or with a label or note
# added): stubs, folds, summaries, and any other strategy's rewrites (mask, clip, cleared).
UNCHANGED = (VERBATIM, LABELLED)
_WHY_CHARS = 240


@dataclass(frozen=True, slots=True)
class Change:
    """One rendered message that is not the history's own."""

    position: int | None  # the history message it renders (None: added, a summary)
    role: str
    kind: str  # stub, fold, summary, ... (``gateway.fold.renderer``'s kinds)
    tokens_before: int  # of the history message (a summary: of what it stands for)
    tokens_after: int
    why: tuple[str, ...]  # the stub, note or summary lines that say what happened


def _why(text: str, kind: str) -> tuple[str, ...]:
    if kind == SUMMARY:
        lines = text.split("\n")[:2]
    else:
        lines = [line for line in text.split("\n") if line.startswith("[") or " folded: " in line]
        lines = [line for line in lines if not line.startswith("[step ") or " " in line[6:]]
    return tuple(line if len(line) <= _WHY_CHARS else line[:_WHY_CHARS] + "…" for line in lines)


def explain_request(
    trajectory: TrajectoryLike, renderer: Renderer, n: int, chat: ChatTokenizer
) -> list[Change] | None:
    """What ``renderer`` changed in request ``n`` (0-based) of ``trajectory``; None when the
    session has fewer requests."""
    cache: Any = None
    for i, request in enumerate(requests_of(trajectory.transcript, trajectory.compaction_indices)):
        rendered = renderer.render(request, None, cache)
        cache = rendered.cache
        if i < n:
            continue
        changes = []
        history = request.messages
        kept = {s for s in rendered.sources if s is not None}
        for m, source, kind in zip(
            rendered.transcript.messages, rendered.sources, rendered.kinds, strict=True
        ):
            if kind in UNCHANGED:
                continue
            if kind == SUMMARY:
                # It stands for the messages after the head that are no longer sent.
                before = sum(
                    chat.message_count(h)
                    for j, h in enumerate(history)
                    if j not in kept and h.role != "system"
                )
            else:
                before = chat.message_count(history[source]) if source is not None else 0
            changes.append(
                Change(source, m.role, kind, before, chat.message_count(m), _why(m.text, kind))
            )
        return changes
    return None
