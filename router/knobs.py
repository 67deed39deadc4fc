"""The routing knobs and their one default each: the gateway's config, the policies and
the simulator all take these.

``REHOME_MARGIN``: 8.0 is what the gateway and the simulator have always run with (the
gateway's config default); the router's own 4.0 reached only policies built without a
margin (tests, the overhead bench). ``ASSIGNMENT_TTL_S``: how long a session's replica
assignment outlives its last request.
"""

from __future__ import annotations

from dataclasses import dataclass

from router.cost import CostModel

REHOME_MARGIN = 8.0
# The longest working-set admission wait, the gateway's and the simulator's default.
ADMISSION_MAX_WAIT_S = 30.0
ASSIGNMENT_TTL_S = 3600.0


class MissingKnob(ValueError):
    """A part needs a knob that has no default (its message says which)."""


@dataclass(frozen=True, slots=True)
class Knobs:
    """What the parts of a policy are built with (each part's ``from_knobs``).

    ``rehome_margin``: the sticky policy's affinity bonus, in requests of load.
    ``cost``: the replicas' cost model, which ``sticky_cost`` prices moves with.
    ``typical_prefill_tokens`` and ``typical_output_tokens``: one queued request's work,
    for queue waits. ``hysteresis`` and ``min_gain_s``: how clearly a priced move must win.
    ``new_session_slack_s``: how far above the shortest queue wait a new session may go;
    None: one typical request's prefill, the granularity the queue estimate has anyway.

    vllm-router's ``cache_aware`` (simulated), at that router's command-line defaults
    (``py_src/vllm_router/router_args.py``): ``cache_threshold``, the share of a prompt a
    replica's approximate tree must match for the prompt to follow it; the load is
    imbalanced (the request goes to the least loaded replica) when max - min exceeds
    ``balance_abs_threshold`` requests and max exceeds min times ``balance_rel_threshold``;
    every ``eviction_interval_s`` each replica's tree is trimmed to ``max_tree_size``
    characters (least recently used first).
    """

    rehome_margin: float = REHOME_MARGIN
    cost: CostModel | None = None
    typical_prefill_tokens: int = 2048
    typical_output_tokens: int = 256
    hysteresis: float = 0.25
    min_gain_s: float = 0.05
    new_session_slack_s: float | None = None
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    eviction_interval_s: float = 120.0
    max_tree_size: int = 2**26
    # Working-set admission (router.working_set_admission; the gateway's config of the same
    # names): the pool share the set may fill, the longest wait, pause reservations, whether
    # a waiter goes when its wait costs more than going, whether that is priced at what the
    # replies' first tokens say an uncached token costs, the steps of growth an entrant leaves
    # room for.
    admission_kv_fraction: float = 0.9
    admission_max_wait_s: float = ADMISSION_MAX_WAIT_S
    pause_reservation: bool = True
    reservation_max_s: float = 120.0
    admission_work_conserving: bool = True
    admission_price_fit: bool = False
    admission_growth_steps: int = 0

    def cost_model(self) -> CostModel:
        if self.cost is None:
            raise MissingKnob("a cost model")
        return self.cost
