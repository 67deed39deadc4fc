"""Prefers the replica most likely holding this request's prefix: where the same agent's
shared prefix (tools and system prompt, ``router.session_route.shared_prefix``) was last
served. Scores the prefill seconds that prefix saves there. The session's own replica is
the cached-prefix scorer's to price; counting the shared prefix there again would count it
twice."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Self

from router.cost import CostModel
from router.inputs import Candidate, RouteContext
from router.knobs import Knobs


@dataclass(frozen=True, slots=True)
class PrefixScorer:
    cost: CostModel

    @classmethod
    def from_knobs(cls, knobs: Knobs) -> Self:
        return cls(knobs.cost_model())

    def score(self, ctx: RouteContext, candidates: Sequence[Candidate]) -> list[float]:
        saved = self.cost.prefill_s(ctx.hints.prefix_tokens)
        home = ctx.prefix_home if ctx.prefix_home != ctx.current else None
        return [saved if c.url == home else 0.0 for c in candidates]
