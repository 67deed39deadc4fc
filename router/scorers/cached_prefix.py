"""The session's affinity, priced: on its assigned replica, the seconds of prefill its
cached prefix saves, plus a hysteresis share of that and a floor, so a move must win
clearly and a session does not bounce between two replicas of similar load."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Self

from router.cost import CostModel
from router.inputs import Candidate, RouteContext
from router.knobs import Knobs


@dataclass(frozen=True, slots=True)
class CachedPrefixScorer:
    cost: CostModel
    hysteresis: float
    min_gain_s: float

    @classmethod
    def from_knobs(cls, knobs: Knobs) -> Self:
        return cls(knobs.cost_model(), knobs.hysteresis, knobs.min_gain_s)

    def score(self, ctx: RouteContext, candidates: Sequence[Candidate]) -> list[float]:
        cached = ctx.hints.cached_prefix_tokens
        if cached is None:  # unknown: assume the whole prompt but this turn's reply
            cached = ctx.hints.prompt_tokens
        saved = self.cost.prefill_s(min(cached, ctx.hints.prompt_tokens or cached))
        bonus = saved * (1 + self.hysteresis) + self.min_gain_s
        return [bonus if c.url == ctx.current else 0.0 for c in candidates]
