"""Minus the expected queue wait on each replica, in seconds."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Self

from router.cost import CostModel
from router.inputs import Candidate, RouteContext
from router.knobs import Knobs

# KV usage from which a replica admits nobody new until a running request finishes; vLLM
# reports usage with cached-but-unreferenced blocks counted free, so near 1.0 means full.
KV_FULL = 0.95


def queue_wait_s(
    c: Candidate, cost: CostModel, typical_prefill_tokens: int, typical_output_tokens: int
) -> float:
    """Expected seconds before a new request on ``c`` starts: every request queued ahead
    prefills first, and a full KV pool admits nobody until a running request has decoded
    about half its output.

    The prefill ahead is what this gateway sent there and sized, where it sized it
    (``Candidate.prefill_backlog_tokens``: with the KV events, each request's prompt less
    what the replica holds of it), and ``typical_prefill_tokens`` for each other request
    queued there (the scrape's, beyond this gateway's own). An agent's requests differ a
    hundredfold in what they prefill (a few hundred tokens of a warm session's new turn,
    the whole history of one whose prefix was evicted or that moved), so the count alone
    puts a replica with one re-prefill queued level with one with a few new turns; without
    the events nothing is sized and the count is all there is."""
    unsized = max(0.0, c.queued - c.prefilling)
    wait = cost.prefill_s(c.prefill_backlog_tokens) + unsized * cost.prefill_s(
        typical_prefill_tokens
    )
    if c.kv_usage is not None and c.kv_usage >= KV_FULL:
        decode_step = cost.step_s(0, max(1, round(c.running)), 0)
        wait += decode_step * typical_output_tokens / 2
    return wait


@dataclass(frozen=True, slots=True)
class QueueWaitScorer:
    cost: CostModel
    typical_prefill_tokens: int
    typical_output_tokens: int

    @classmethod
    def from_knobs(cls, knobs: Knobs) -> Self:
        return cls(knobs.cost_model(), knobs.typical_prefill_tokens, knobs.typical_output_tokens)

    def score(self, ctx: RouteContext, candidates: Sequence[Candidate]) -> list[float]:
        return [
            -queue_wait_s(c, self.cost, self.typical_prefill_tokens, self.typical_output_tokens)
            for c in candidates
        ]
