"""Highest score wins. On a tie the session's current replica stays; other ties rotate, so
idle replicas share new sessions instead of the first one in the list taking all of them
until the next scrape shows its load."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Self

from router.inputs import Candidate, RouteContext
from router.knobs import Knobs
from router.parts import Picked, best_tied


class MaxScorePicker:
    @classmethod
    def from_knobs(cls, knobs: Knobs) -> Self:
        return cls()

    def pick(
        self, ctx: RouteContext, candidates: Sequence[Candidate], scores: Sequence[float]
    ) -> Picked:
        tied, current = best_tied(ctx, candidates, scores)
        if current is not None:
            return current
        return Picked(tied[(ctx.turn + 1) % len(tied)], turned=True)
