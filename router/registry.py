"""The registration table: every routing part by name, and every policy as a composition
of parts.

Adding a part is one module under ``router.filters``, ``router.scorers`` or
``router.pickers`` (a class with ``from_knobs`` and ``filter``, ``score`` or ``pick``)
and one entry below; a policy names the parts it runs. Policies (config names):

- ``round_robin``: no scorers; the picker rotates over the candidates.
- ``least_loaded``: the load scorer; lowest load wins, ties rotate.
- ``sticky``: new sessions go to the least loaded replica; a bound session's replica gets
  an affinity bonus of ``rehome_margin`` requests, so the session moves only when its
  replica is unusable or busier than the least-loaded one by more than the margin,
  whatever its cached prefix is worth.
- ``sticky_cost``: prices a move. All its scorers speak seconds of expected delay saved
  (llm-d's normalised [0, 1] scores cannot compare a queue with a cached prefix): queue
  wait (from scraped waiting/running and KV usage) against re-prefilling the session's
  cached prefix elsewhere (its size from the store's per-session accounting, in
  `RouteHints`), plus a prefix scorer for replicas holding the same agent's system prompt
  or a forked session's parent, and one for replicas the KV events say still hold the
  session's prefix; a move must win by a hysteresis margin. New sessions go
  where they fit best: among replicas whose queue wait is near the shortest, the most free
  KV and fewest bound sessions.

vllm-router's policies, as the simulator models them for the peer arms (the gateway does
not offer them: ``POLICY_NAMES`` is what it offers, ``SIMULATED_POLICY_NAMES`` what
``foldgate simulate`` runs; an operator who wants them runs vllm-router itself):

- ``consistent_hash``: the session id on a hash ring of every replica (160 virtual nodes).
- ``sticky_least_loaded``: a new session goes to the replica with the fewest sessions
  assigned (ties by a rendezvous hash of the session id), and stays there.
- ``cache_aware``: an approximate prefix tree per replica of the prompts sent there; the
  prompt follows the replica matching most of it above ``cache_threshold``, else the least
  loaded one, and the least loaded one whenever the load is imbalanced. It reads the
  prompt's chained block keys (``RouteHints.block_chain``), which only the simulator has.

``ADMISSIONS``: the admission seam's implementations (``router.admission_seam``) by name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from router.admission_seam import Admission, AdmitAll
from router.filters.queue_slack import QueueSlackFilter
from router.knobs import Knobs
from router.parts import Filter, Picker, Profile, Scorer, Weighted
from router.pickers.first_best import FirstBestPicker
from router.pickers.hash_ring import HashRingPicker
from router.pickers.max_score import MaxScorePicker
from router.pickers.rendezvous import RendezvousPicker
from router.pickers.round_robin import RoundRobinPicker
from router.scorers.affinity import AffinityBonusScorer
from router.scorers.approx_tree import ApproxTreeScorer
from router.scorers.cached_prefix import CachedPrefixScorer
from router.scorers.fit import FitScorer
from router.scorers.kv_resident import KvResidentScorer
from router.scorers.load import LoadScorer
from router.scorers.prefix import PrefixScorer
from router.scorers.queue_wait import QueueWaitScorer
from router.scorers.sessions import FewestSessionsScorer
from router.working_set_admission import WorkingSetAdmission

FILTERS: dict[str, Callable[[Knobs], Filter]] = {
    "queue_slack": QueueSlackFilter.from_knobs,
}
SCORERS: dict[str, Callable[[Knobs], Scorer]] = {
    "load": LoadScorer.from_knobs,
    "affinity": AffinityBonusScorer.from_knobs,
    "queue_wait": QueueWaitScorer.from_knobs,
    "cached_prefix": CachedPrefixScorer.from_knobs,
    "prefix": PrefixScorer.from_knobs,
    "fit": FitScorer.from_knobs,
    "fewest_sessions": FewestSessionsScorer.from_knobs,
    "approx_tree": ApproxTreeScorer.from_knobs,
    "kv_resident": KvResidentScorer.from_knobs,
}
PICKERS: dict[str, Callable[[Knobs], Picker]] = {
    "max_score": MaxScorePicker.from_knobs,
    "round_robin": RoundRobinPicker.from_knobs,
    "hash_ring": HashRingPicker.from_knobs,
    "rendezvous": RendezvousPicker.from_knobs,
    "first_best": FirstBestPicker.from_knobs,
}


@dataclass(frozen=True)
class ProfileSpec:
    """One filter -> score -> pick pass by part names; scorers with their weights."""

    scorers: tuple[tuple[str, float], ...] = ()
    picker: str = "max_score"
    filters: tuple[str, ...] = ()
    rotation: str = "new"  # the turn count its picker's tie-breaks read

    def build(self, knobs: Knobs) -> Profile:
        return Profile(
            scorers=tuple(Weighted(SCORERS[name](knobs), weight) for name, weight in self.scorers),
            picker=PICKERS[self.picker](knobs),
            filters=tuple(FILTERS[name](knobs) for name in self.filters),
            rotation=self.rotation,
        )


@dataclass(frozen=True)
class PolicySpec:
    """A policy: the profile a request without a usable assignment runs (every request,
    for a policy that keeps none), and the one a session bound to a usable replica runs.

    ``bound``: None for a policy that keeps no session -> replica assignment.
    ``moved_reason``: what a move the bound profile chose is logged and counted under.
    ``shared_prefixes``: the policy remembers where each shared prefix was served, for its
    prefix scorer (the gateway computes the prefix's key only then).
    ``uses_cached_prefix``: `RouteHints.cached_prefix_tokens` matters to it (the gateway
    reads the session's accounting for it only then).
    ``prefix_tree``: the policy keeps an approximate prefix tree per replica
    (``router.policies.PrefixTreePolicy``), read through ``RouteContext.matched``.
    ``gateway``: the gateway offers it (else only the simulator runs it).
    """

    new: ProfileSpec
    bound: ProfileSpec | None = None
    moved_reason: str = ""
    shared_prefixes: bool = False
    uses_cached_prefix: bool = False
    prefix_tree: bool = False
    gateway: bool = True


POLICIES: dict[str, PolicySpec] = {
    "round_robin": PolicySpec(new=ProfileSpec(picker="round_robin")),
    "least_loaded": PolicySpec(new=ProfileSpec(scorers=(("load", 1.0),))),
    # Both profiles take one rotation's turns: a session moved by load continues the turns
    # new sessions take.
    "sticky": PolicySpec(
        new=ProfileSpec(scorers=(("load", 1.0),), rotation="sessions"),
        bound=ProfileSpec(scorers=(("load", 1.0), ("affinity", 1.0)), rotation="sessions"),
        moved_reason="overloaded",
    ),
    "sticky_cost": PolicySpec(
        new=ProfileSpec(filters=("queue_slack",), scorers=(("fit", 1.0), ("prefix", 1.0))),
        bound=ProfileSpec(
            scorers=(
                ("queue_wait", 1.0),
                ("cached_prefix", 1.0),
                ("prefix", 1.0),
                ("kv_resident", 1.0),
            ),
            rotation="bound",
        ),
        moved_reason="queue_cost",
        shared_prefixes=True,
        uses_cached_prefix=True,
    ),
    # vllm-router's (simulated; the module docstring).
    "consistent_hash": PolicySpec(new=ProfileSpec(picker="hash_ring"), gateway=False),
    # A bound session stays (no scorer: every score ties, the picker keeps the current).
    "sticky_least_loaded": PolicySpec(
        new=ProfileSpec(scorers=(("fewest_sessions", 1.0),), picker="rendezvous"),
        bound=ProfileSpec(),
        moved_reason="moved",
        gateway=False,
    ),
    "cache_aware": PolicySpec(
        new=ProfileSpec(scorers=(("approx_tree", 1.0),), picker="first_best"),
        prefix_tree=True,
        gateway=False,
    ),
}
POLICY_NAMES: tuple[str, ...] = tuple(sorted(n for n, spec in POLICIES.items() if spec.gateway))
SIMULATED_POLICY_NAMES: tuple[str, ...] = tuple(sorted(POLICIES))
# vllm-router's policies the simulator models, by that router's names.
PEER_POLICY_NAMES: tuple[str, ...] = ("cache_aware", "consistent_hash", "sticky_least_loaded")

ADMISSIONS: dict[str, Callable[[Knobs], Admission]] = {
    "off": AdmitAll.from_knobs,
    "working_set": WorkingSetAdmission.from_knobs,
}
