"""vllm-router's ``cache_aware`` decision (``src/policies/cache_aware.rs``) as one score.

When the router's own in-flight counts are imbalanced (max - min above
``balance_abs_threshold`` and max above min times ``balance_rel_threshold``) the least
loaded replica wins. Otherwise the replica whose approximate tree matches most of the
prompt (``RouteContext.matched``) wins if that match is above ``cache_threshold`` of the
prompt, else the least loaded one. Scores: minus the load, or 1 for the matched replica and
minus infinity for the others; with the first-best picker ties go to the first replica, as
the router's ``min_by_key`` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Self

from router.inputs import Candidate, RouteContext
from router.knobs import Knobs


@dataclass(frozen=True, slots=True)
class ApproxTreeScorer:
    cache_threshold: float
    balance_abs_threshold: int
    balance_rel_threshold: float

    @classmethod
    def from_knobs(cls, knobs: Knobs) -> Self:
        if not 0 <= knobs.cache_threshold <= 1:
            raise ValueError(f"cache_threshold must be in [0, 1], got {knobs.cache_threshold}")
        return cls(knobs.cache_threshold, knobs.balance_abs_threshold, knobs.balance_rel_threshold)

    def imbalanced(self, loads: Sequence[int]) -> bool:
        most, least = max(loads), min(loads)
        return (
            most - least > self.balance_abs_threshold and most > least * self.balance_rel_threshold
        )

    def score(self, ctx: RouteContext, candidates: Sequence[Candidate]) -> list[float]:
        loads = [c.in_flight for c in candidates]
        by_load = [-float(n) for n in loads]
        if self.imbalanced(loads):
            return by_load
        matched = [ctx.matched.get(c.url, 0) for c in candidates]
        best = max(matched)
        prompt = ctx.hints.prompt_tokens
        if prompt <= 0 or best / prompt <= self.cache_threshold:
            return by_load
        first = matched.index(best)
        return [1.0 if i == first else -float("inf") for i in range(len(candidates))]
