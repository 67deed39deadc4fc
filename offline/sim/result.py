"""One simulated cell's measurements, and their summary row."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


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

    @property
    def hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    @property
    def steps_per_min(self) -> float:
        return self.requests / (self.window_s / 60)

    def summary(self) -> dict[str, Any]:
        def pct(xs: list[float], q: float) -> float:
            return float(np.percentile(xs, q)) if xs else 0.0

        def mean(xs: list[float]) -> float:
            return float(np.mean(xs)) if xs else 0.0

        return {
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
