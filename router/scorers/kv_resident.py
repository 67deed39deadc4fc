"""Where the session's prefix still is, by the replicas' KV events: on each replica but
the session's own, the prefill seconds its resident blocks save (a session moved by load
whose old replica still holds its prefix goes back there rather than anywhere cold). The
session's own replica is the cached-prefix scorer's to price (the gateway gives it the
resident figure there); counting it here again would count it twice. All 0 without
events (``RouteHints.resident_tokens`` None)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Self

from router.cost import CostModel
from router.inputs import Candidate, RouteContext
from router.knobs import Knobs


@dataclass(frozen=True, slots=True)
class KvResidentScorer:
    cost: CostModel

    @classmethod
    def from_knobs(cls, knobs: Knobs) -> Self:
        return cls(knobs.cost_model())

    def score(self, ctx: RouteContext, candidates: Sequence[Candidate]) -> list[float]:
        resident = ctx.hints.resident_tokens or {}
        return [
            0.0 if c.url == ctx.current else self.cost.prefill_s(resident.get(c.url, 0))
            for c in candidates
        ]
