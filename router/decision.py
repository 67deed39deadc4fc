"""A routing decision: a pure function of a `RouteInput`.

The policy around it (``router.policies``) reads what the decision needs (the pool's
routable replicas, the session's assignment, the placements it remembers) and acts on
what it chose (writes the assignment, remembers the placement, advances the rotation).
"""

from __future__ import annotations

from dataclasses import dataclass

from router.inputs import RouteContext, RouteInput
from router.parts import Profile


@dataclass(frozen=True, slots=True)
class Choice:
    url: str
    reason: str
    # The replica the session was assigned to before this choice moved it, if it moved.
    moved_from: str | None = None
    # The rotation whose turn the pick took, if it took one.
    turned: str | None = None


def displaced(inp: RouteInput) -> str | None:
    """Why the session's assigned replica cannot keep it (a reason), or None if it can
    (or the session has none)."""
    current = inp.assignment
    if current is None:
        return None
    if current not in inp.replicas:
        return "gone"
    if current in inp.exclude:
        return "excluded"
    if all(c.url != current for c in inp.candidates):
        return "unhealthy"
    return None


@dataclass(frozen=True)
class Decider:
    """A policy's decision. ``bound``: the profile for a session whose assigned replica
    can keep it; None for a policy that keeps no assignment (its reason is its name)."""

    name: str
    new: Profile
    bound: Profile | None = None
    moved_reason: str = ""

    def decide(self, inp: RouteInput) -> Choice:
        why = displaced(inp)
        current = inp.assignment if why is None else None
        profile = self.new if current is None or self.bound is None else self.bound
        ctx = RouteContext(
            inp.tenant,
            inp.session,
            inp.hints,
            current=current,
            prefix_home=inp.prefix_home,
            turn=inp.turns.get(profile.rotation, 0),
            replicas=inp.replicas,
            matched=inp.matched,
        )
        admitted = inp.hints.admitted
        if admitted is not None and any(c.url == admitted for c in inp.candidates):
            url, turned = admitted, None  # working-set admission placed it (RouteHints)
        else:
            picked = profile.run(ctx, inp.candidates)
            url = picked.candidate.url
            turned = profile.rotation if picked.turned else None
        if self.bound is None:
            return Choice(url, self.name, turned=turned)
        if inp.assignment is None:
            reason = "new"
        elif why is not None:
            reason = why
        elif url == current:
            reason = "sticky"
        else:
            reason = "admitted" if url == admitted else self.moved_reason
        moved_from = None if reason == "sticky" else inp.assignment
        return Choice(url, reason, moved_from, turned)
