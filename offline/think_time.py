"""Think time: the seconds an agent session spends between a reply and its next request
(its tool's run, the harness's work, a person typing). One rule for the Locust harness
(``loadtests.locustfile``) and the simulator (``offline.sim.cluster``), so a simulated cell
replays a recording as the measured cell it is calibrated against did.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ThinkTime:
    """Seconds between a reply and the next request.

    The recorded gap where the trajectory logged one (``Step.think_s``: tool runs, harness
    work, a person typing), cut to ``cap_s`` (a person away for an hour is an idle session,
    not load); else, or with ``recorded=False``, a draw from the fallback distribution, which
    models a tool call plus harness work: lognormal with median ``scale_s`` and ``sigma``,
    or with ``sigma=None`` exponential with mean ``scale_s`` (the simulator's default).
    ``scale_s == 0`` is a saturation run: no think time at all, recorded or not.
    """

    scale_s: float = 3.0
    sigma: float | None = 0.8
    cap_s: float = 60.0
    recorded: bool = True

    @classmethod
    def parse(cls, spec: str, *, cap_s: float = 60.0, recorded: bool = True) -> ThinkTime:
        """``0``, ``MEDIAN`` or ``MEDIAN:SIGMA`` (seconds) for the lognormal fallback."""
        parts = spec.split(":")
        try:
            values = [float(p) for p in parts]
        except ValueError:
            raise ValueError(
                f"think time must be MEDIAN[:SIGMA] in seconds, got {spec!r}"
            ) from None
        if len(values) > 2 or any(v < 0 for v in values):
            raise ValueError(f"think time must be MEDIAN[:SIGMA] in seconds, got {spec!r}")
        if cap_s < 0:
            raise ValueError(f"think-time cap must be >= 0 seconds, got {cap_s}")
        return cls(*values, cap_s=cap_s, recorded=recorded)

    def sample(self, rng: random.Random, recorded_s: float | None = None) -> float:
        """One think time; a draw takes ``rng``'s next value, a recorded gap takes none."""
        if self.scale_s == 0:
            return 0.0
        if self.recorded and recorded_s is not None:
            return min(recorded_s, self.cap_s)
        if self.sigma is None:
            return rng.expovariate(1 / self.scale_s)
        return rng.lognormvariate(math.log(self.scale_s), self.sigma)
