"""Fewer sessions bound to the replica is better (vllm-router's ``sticky_least_loaded``
counts the sessions it assigned to each replica, ended or not, until they expire)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Self

from router.inputs import Candidate, RouteContext
from router.knobs import Knobs


class FewestSessionsScorer:
    @classmethod
    def from_knobs(cls, knobs: Knobs) -> Self:
        return cls()

    def score(self, ctx: RouteContext, candidates: Sequence[Candidate]) -> list[float]:
        return [-float(c.bound_sessions) for c in candidates]
