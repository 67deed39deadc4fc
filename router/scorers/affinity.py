"""A fixed bonus for the session's assigned replica, in the other scorers' units: with the
load scorer, ``rehome_margin`` requests, so a session moves only when its replica is busier
than the least-loaded one by more than the margin."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Self

from router.inputs import Candidate, RouteContext
from router.knobs import Knobs


@dataclass(frozen=True, slots=True)
class AffinityBonusScorer:
    bonus: float

    @classmethod
    def from_knobs(cls, knobs: Knobs) -> Self:
        if knobs.rehome_margin < 0:
            raise ValueError(f"rehome_margin must be >= 0, got {knobs.rehome_margin}")
        return cls(knobs.rehome_margin)

    def score(self, ctx: RouteContext, candidates: Sequence[Candidate]) -> list[float]:
        return [self.bonus if c.url == ctx.current else 0.0 for c in candidates]
