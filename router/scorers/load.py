"""Fewer requests is better: minus each replica's load (scraped running + waiting plus
this gateway's in-flight requests)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Self

from router.inputs import Candidate, RouteContext
from router.knobs import Knobs


class LoadScorer:
    @classmethod
    def from_knobs(cls, knobs: Knobs) -> Self:
        return cls()

    def score(self, ctx: RouteContext, candidates: Sequence[Candidate]) -> list[float]:
        return [-c.load for c in candidates]
