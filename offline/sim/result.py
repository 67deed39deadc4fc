"""One simulated cell's measurements, and their summary row."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One measured request, as the simulator served it (``SimConfig.log_requests``): its
    session and step, where it went and why (the decision's ``reason``, the replica it moved
    from), its times in simulated seconds (sent by the client; arrived at the engine after
    any admission wait and the serving path's latency; first scheduled; first token;
    finished), its prompt, the prefix-cache hit at its admission, its output, how often it
    was preempted and its vLLM priority. Where a tail latency comes from is read off these:
    a cold start (step 0), a re-prefill (``cached_tokens`` short of the session's last
    prompt), a move, queueing (``first_scheduled - arrival``), or the gateway's wait."""

    session: int
    step: int
    trajectory: str
    replica: int
    reason: str
    moved_from: str | None
    sent: float
    arrival: float
    first_scheduled: float
    first_token: float
    finished: float
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    preemptions: int
    priority: int


@dataclass(slots=True)
class CellResult:
    """One (policy, strategy, load) cell, measured over [warmup, duration)."""

    policy: str
    strategy: str
    load: str
    window_s: float
    requests: int
    prefix_queries: int
    prefix_hits: int
    queue_s: list[float]
    ttft_s: list[float]
    preemptions: int
    moves: int
    sessions_started: int
    kv_time: list[float] = field(default_factory=list)
    kv_mean: list[float] = field(default_factory=list)
    kv_max: list[float] = field(default_factory=list)
    # Each measured request's wait at the gateway's admission seam (0 when admitted at once).
    admission_wait_s: list[float] = field(default_factory=list)
    # Each measured request, in the order they finished (``SimConfig.log_requests``).
    request_log: list[RequestRecord] = field(default_factory=list)
    # With a CPU offload tier: vLLM's connector counters (the tokens first admissions
    # asked of it past their GPU hit, and those it held and loaded).
    offload: bool = False
    external_queries: int = 0
    external_hits: int = 0

    @property
    def hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    @property
    def offload_hit_rate(self) -> float:
        """Loaded from the offload tier, of every prompt token queried (so the GPU's hit
        rate and this add up to the share of prompt tokens not prefilled)."""
        return self.external_hits / self.prefix_queries if self.prefix_queries else 0.0

    @property
    def steps_per_min(self) -> float:
        return self.requests / (self.window_s / 60)

    def summary(self) -> dict[str, Any]:
        def pct(xs: list[float], q: float) -> float:
            return float(np.percentile(xs, q)) if xs else 0.0

        def mean(xs: list[float]) -> float:
            return float(np.mean(xs)) if xs else 0.0

        row: dict[str, Any] = {
            "policy": self.policy,
            "strategy": self.strategy,
            "load": self.load,
            "requests": self.requests,
            "prefix_hit_rate": round(self.hit_rate, 4),
            "queue_mean_s": round(mean(self.queue_s), 4),
            "queue_p95_s": round(pct(self.queue_s, 95), 4),
            "ttft_mean_s": round(mean(self.ttft_s), 4),
            "ttft_p95_s": round(pct(self.ttft_s, 95), 4),
            "session_steps_per_min": round(self.steps_per_min, 1),
            "preemptions": self.preemptions,
            "moves": self.moves,
            "kv_usage_mean": round(mean(self.kv_mean), 4),
            "kv_usage_max": round(max(self.kv_max, default=0.0), 4),
            "admission_wait_max_s": round(max(self.admission_wait_s, default=0.0), 4),
        }
        if self.offload:
            row["offload_hit_rate"] = round(self.offload_hit_rate, 4)
        return row
