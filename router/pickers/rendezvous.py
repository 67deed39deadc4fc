"""Highest score wins; ties go to the candidate with the highest rendezvous hash of
"session:url" (vllm-router's ``sticky_least_loaded`` tie-break, with its ``fbi_hash``), so a
session meeting the same tied replicas is always placed on the same one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Self

from router.inputs import Candidate, RouteContext
from router.knobs import Knobs
from router.parts import Picked, best_tied
from router.pickers.hash_ring import fbi_hash


class RendezvousPicker:
    @classmethod
    def from_knobs(cls, knobs: Knobs) -> Self:
        return cls()

    def pick(
        self, ctx: RouteContext, candidates: Sequence[Candidate], scores: Sequence[float]
    ) -> Picked:
        tied, current = best_tied(ctx, candidates, scores)
        if current is not None:
            return current
        # Rust's comparison keeps the first of equal weights.
        weights = [fbi_hash(f"{ctx.session}:{c.url}") for c in tied]
        return Picked(tied[weights.index(max(weights))], turned=False)
