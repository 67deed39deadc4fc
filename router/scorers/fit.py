"""Where a new session fits: most free KV, then fewest sessions bound there. In [0, 2]."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Self

from router.inputs import Candidate, RouteContext
from router.knobs import Knobs


class FitScorer:
    @classmethod
    def from_knobs(cls, knobs: Knobs) -> Self:
        return cls()

    def score(self, ctx: RouteContext, candidates: Sequence[Candidate]) -> list[float]:
        most = max(c.bound_sessions for c in candidates)
        return [
            (1.0 - (c.kv_usage or 0.0)) + (1.0 - c.bound_sessions / (most + 1)) for c in candidates
        ]
