"""Keep the replicas whose expected queue wait is within a slack of the shortest."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Self

from router.cost import CostModel
from router.inputs import Candidate, RouteContext
from router.knobs import Knobs
from router.scorers.queue_wait import queue_wait_s


@dataclass(frozen=True, slots=True)
class QueueSlackFilter:
    cost: CostModel
    typical_prefill_tokens: int
    typical_output_tokens: int
    slack_s: float

    @classmethod
    def from_knobs(cls, knobs: Knobs) -> Self:
        cost = knobs.cost_model()
        slack = knobs.new_session_slack_s
        if slack is None:
            slack = cost.prefill_s(knobs.typical_prefill_tokens)
        return cls(cost, knobs.typical_prefill_tokens, knobs.typical_output_tokens, slack)

    def filter(self, ctx: RouteContext, candidates: Sequence[Candidate]) -> list[Candidate]:
        waits = [
            queue_wait_s(c, self.cost, self.typical_prefill_tokens, self.typical_output_tokens)
            for c in candidates
        ]
        best = min(waits)
        return [c for c, w in zip(candidates, waits, strict=True) if w <= best + self.slack_s]
