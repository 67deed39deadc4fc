"""Ignores scores: the candidate whose turn it is."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Self

from router.inputs import Candidate, RouteContext
from router.knobs import Knobs
from router.parts import Picked


class RoundRobinPicker:
    @classmethod
    def from_knobs(cls, knobs: Knobs) -> Self:
        return cls()

    def pick(
        self, ctx: RouteContext, candidates: Sequence[Candidate], scores: Sequence[float]
    ) -> Picked:
        return Picked(candidates[ctx.turn % len(candidates)], turned=True)
