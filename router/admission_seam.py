"""The admission seam: whether a routed request may go to its replica now.

Issue 20's working-set admission plugs in here. An ``Admission`` is asked after the policy
chose a replica and before the request counts in flight there (``AdmissionVerdict``); it is
registered by name in ``router.registry.ADMISSIONS``, and ``AdmitAll`` ("off") is today's
behaviour. The gateway awaits the answer through ``router.with_failover(admit=...)``; the
simulator (``offline.sim.routing``) parks a refused request at its gateway and asks again at
``retry_at`` and at every reply end. ``decide`` is pure: ``now`` comes in with the request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Self

from router.inputs import Candidate
from router.knobs import Knobs


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    """A routed request asking to go to ``replica`` now. ``candidates``: the routable
    replicas as the decision saw them; ``now``: the caller's clock (simulated seconds in
    the simulator); ``waited_s``: how long it has waited at the gateway so far."""

    tenant: str
    session: str
    replica: str
    prompt_tokens: int
    cached_prefix_tokens: int | None
    candidates: tuple[Candidate, ...]
    now: float
    waited_s: float = 0.0


@dataclass(frozen=True, slots=True)
class AdmissionVerdict:
    """``admit``: go now. Otherwise wait, and ask again no later than ``retry_at`` (the
    caller's clock), or at the next reply end on any replica when None."""

    admit: bool
    reason: str = "admitted"
    retry_at: float | None = None


ADMITTED = AdmissionVerdict(True)


class Admission(Protocol):
    """The admission seam: a pure ``decide`` and the events its state follows."""

    def decide(self, request: AdmissionRequest) -> AdmissionVerdict: ...

    def started(self, request: AdmissionRequest) -> None:
        """``request`` was admitted and sent."""
        ...

    def ended(self, tenant: str, session: str, replica: str, now: float) -> None:
        """A reply of the session on ``replica`` ended."""
        ...


class AdmitAll:
    """Every request goes at once (no admission control): today's behaviour."""

    @classmethod
    def from_knobs(cls, knobs: Knobs) -> Self:
        return cls()

    def decide(self, request: AdmissionRequest) -> AdmissionVerdict:
        return ADMITTED

    def started(self, request: AdmissionRequest) -> None:
        return None

    def ended(self, tenant: str, session: str, replica: str, now: float) -> None:
        return None
