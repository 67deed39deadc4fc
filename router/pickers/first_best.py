"""Highest score wins, the first such candidate in pool order on a tie (what Rust's
``min_by_key`` over the replicas does in vllm-router's least-load choices)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Self

from router.inputs import Candidate, RouteContext
from router.knobs import Knobs
from router.parts import Picked


class FirstBestPicker:
    @classmethod
    def from_knobs(cls, knobs: Knobs) -> Self:
        return cls()

    def pick(
        self, ctx: RouteContext, candidates: Sequence[Candidate], scores: Sequence[float]
    ) -> Picked:
        return Picked(candidates[list(scores).index(max(scores))], turned=False)
