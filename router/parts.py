"""The three plug points of a routing decision, as llm-d's endpoint picker has them:
filters drop candidates, scorers give each remaining one a number (higher is better), a
picker takes one. Each implementation is a module of ``router.filters``,
``router.scorers`` or ``router.pickers``, registered by name in ``router.registry``.

Every part is pure: it sees the request (`RouteContext`) and replica snapshots
(`Candidate`), does no I/O, reads no clock and keeps no state between calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from router.inputs import Candidate, RouteContext


class Filter(Protocol):
    def filter(self, ctx: RouteContext, candidates: Sequence[Candidate]) -> list[Candidate]:
        """The candidates worth scoring, in order."""
        ...


class Scorer(Protocol):
    def score(self, ctx: RouteContext, candidates: Sequence[Candidate]) -> list[float]:
        """One score per candidate, in order; higher is better."""
        ...


@dataclass(frozen=True, slots=True)
class Picked:
    candidate: Candidate
    # The pick took a turn of the profile's rotation: the next pick starts from the next.
    turned: bool


class Picker(Protocol):
    def pick(
        self, ctx: RouteContext, candidates: Sequence[Candidate], scores: Sequence[float]
    ) -> Picked: ...


def best_tied(
    ctx: RouteContext, candidates: Sequence[Candidate], scores: Sequence[float]
) -> tuple[list[Candidate], Picked | None]:
    """The candidates tied at the highest score, and the pick when the session's current
    replica is among them: it stays on a tie (moving would cost its prefix cache for
    nothing). A picker breaks the other ties its own way."""
    best = max(scores)
    tied = [c for c, s in zip(candidates, scores, strict=True) if s == best]
    for c in tied:
        if c.url == ctx.current:
            return tied, Picked(c, turned=False)
    return tied, None


@dataclass(frozen=True, slots=True)
class Weighted:
    scorer: Scorer
    weight: float = 1.0


@dataclass(frozen=True)
class Profile:
    """One filter -> score -> pick pass. ``rotation`` names the turn count its picker's
    tie-breaks read (`RouteContext.turn`)."""

    scorers: tuple[Weighted, ...]
    picker: Picker
    filters: tuple[Filter, ...] = ()
    rotation: str = "new"

    def run(self, ctx: RouteContext, candidates: Sequence[Candidate]) -> Picked:
        found = list(candidates)
        for f in self.filters:
            found = f.filter(ctx, found) or found  # a filter never empties the field
        totals = [0.0] * len(found)
        for w in self.scorers:
            for i, s in enumerate(w.scorer.score(ctx, found)):
                totals[i] += w.weight * s
        return self.picker.pick(ctx, found, totals)
