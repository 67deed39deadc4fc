"""The admission seam: whether a routed request may go to its replica now.

Issue 20's working-set admission plugs in here. An ``Admission`` is registered by name in
``router.registry.ADMISSIONS``; ``AdmitAll`` ("off") is today's behaviour. ``decide`` is
pure: ``now`` comes in with the request.

One order for the gateway (``gateway.steps.working_set``, from the pipeline's KV step) and
the simulator (``offline.sim.routing``): the request is asked about *before* the policy
routes it, for the session's own replica (its assignment) or, without one that is
routable, for the replica with the most free KV (``admission_request``); refused, it waits
at the gateway and is asked again at ``retry_at``, and when the admission's state changes
if the admission names it (``wake``: the waiters that may go then); admitted,
``started``; once a replica accepted it (the first chunk), where the policy placed it
elsewhere its share moves there (``relocate``); at its reply's end, ``ended``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, Self

from router.inputs import Candidate
from router.knobs import Knobs


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    """A routed request asking to go to ``replica`` now. ``candidates``: the routable
    replicas as the decision saw them; ``now``: the caller's clock (simulated seconds in
    the simulator); ``waited_s``: how long it has waited at the gateway so far;
    ``roaming``: ``replica`` was chosen by room (the session has no routable replica of its
    own), so asked again it may ask for another."""

    tenant: str
    session: str
    replica: str
    prompt_tokens: int
    cached_prefix_tokens: int | None
    candidates: tuple[Candidate, ...]
    now: float
    waited_s: float = 0.0
    roaming: bool = False


@dataclass(frozen=True, slots=True)
class AdmissionVerdict:
    """``admit``: go now. Otherwise wait, and ask again no later than ``retry_at`` (the
    caller's clock), or at the next reply end on any replica when None."""

    admit: bool
    reason: str = "admitted"
    retry_at: float | None = None


ADMITTED = AdmissionVerdict(True)
# A served reply's (uncached prompt tokens, seconds from send to its first token).
FirstToken = tuple[int, float]


class Admission(Protocol):
    """The admission seam: a pure ``decide`` and the events its state follows."""

    def decide(self, request: AdmissionRequest) -> AdmissionVerdict: ...

    def started(self, request: AdmissionRequest) -> None:
        """``request`` was admitted and sent."""
        ...

    def ended(
        self,
        tenant: str,
        session: str,
        replica: str,
        now: float,
        *,
        served: bool = True,
        first_token: FirstToken | None = None,
        pausing: bool = True,
    ) -> None:
        """A reply of the session on ``replica`` ended (``served``: answered; else it
        failed, or its share moved to another replica); ``first_token``: the tokens its
        replica prefilled and the seconds to its first token, where measured;
        ``pausing``: the session's next request follows a tool call (False: the reply
        ended the agent's turn, ``router.turn_end``)."""
        ...

    def wake(self, ask: Callable[[tuple[str, str]], object]) -> None:
        """The state changed: ``ask`` (decide again for) each waiting (tenant, session)
        that may go now, in arrival order."""
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

    def ended(
        self,
        tenant: str,
        session: str,
        replica: str,
        now: float,
        *,
        served: bool = True,
        first_token: FirstToken | None = None,
        pausing: bool = True,
    ) -> None:
        return None

    def wake(self, ask: Callable[[tuple[str, str]], object]) -> None:
        return None  # nobody waits


def admission_request(
    tenant: str,
    session: str,
    home: str | None,
    prompt_tokens: int,
    candidates: Sequence[Candidate],
    *,
    now: float,
    since: float,
    free: Callable[[Candidate], tuple[int, int]],
) -> AdmissionRequest | None:
    """What is asked for a request about to be routed: its session's replica ``home``
    when routable, else the candidate with the most ``free`` room (``WorkingSetAdmission.
    free_tokens``: beside its working set, then the fewest members); ``since``: when it
    first asked. None when no replica is routable (routing answers that)."""
    if not candidates:
        return None
    urls = {c.url for c in candidates}
    roaming = home is None or home not in urls
    replica = max(candidates, key=free).url if roaming or home is None else home
    return AdmissionRequest(
        tenant, session, replica, prompt_tokens, None, tuple(candidates), now, now - since,
        roaming,
    )  # fmt: skip


def binds_placement(request: AdmissionRequest, reason: str) -> bool:
    """Whether the policy places an admitted request where admission counted it
    (``RouteHints.admitted``): where admission chose the replica by room (``roaming``), or
    the request waited for room there (``reason`` "waited"). Otherwise, a session admitted
    on its own replica, the policy routes it as it would without admission, and a move
    takes its share along (``relocate``): pinned to its home, no session would ever leave a
    replica its policy finds overloaded (docs/results/2026-12-04-gpu-scale-kv-4.md)."""
    return request.roaming or reason == "waited"


def relocate(
    admission: Admission, request: AdmissionRequest, url: str, now: float
) -> AdmissionRequest:
    """The replica ``url`` accepted the admitted ``request``: where the policy placed it
    elsewhere than admission looked, its share moves there. The request in force after."""
    if request.replica == url:
        return request
    admission.ended(request.tenant, request.session, request.replica, now, served=False)
    moved = replace(request, replica=url, now=now)
    admission.started(moved)
    return moved
