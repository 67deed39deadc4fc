"""Router: replica pool, health checks, vLLM metrics scraping, routing policies, failover."""

from router.assignments import AssignmentStore
from router.cost import PRESETS as COST_PRESETS
from router.cost import CostModel, get_preset
from router.failover import UpstreamFailed, reading_reply, with_failover
from router.inputs import RouteHints
from router.knobs import ASSIGNMENT_TTL_S, REHOME_MARGIN, Knobs
from router.metrics import MetricsParseError, ReplicaMetrics, parse_vllm_metrics
from router.policies import (
    AssignedSessionPolicy,
    Decision,
    NoHealthyReplica,
    ProfilePolicy,
    RoutingPolicy,
    make_policy,
)
from router.pool import ReplicaPool
from router.registry import PEER_POLICY_NAMES, POLICY_NAMES, SIMULATED_POLICY_NAMES
from router.replica import Replica
from router.tenant_policies import TenantPolicies, make_tenant_policy

__all__ = [
    "ASSIGNMENT_TTL_S",
    "COST_PRESETS",
    "PEER_POLICY_NAMES",
    "POLICY_NAMES",
    "REHOME_MARGIN",
    "SIMULATED_POLICY_NAMES",
    "AssignedSessionPolicy",
    "AssignmentStore",
    "CostModel",
    "Decision",
    "Knobs",
    "MetricsParseError",
    "NoHealthyReplica",
    "ProfilePolicy",
    "Replica",
    "ReplicaMetrics",
    "ReplicaPool",
    "RouteHints",
    "RoutingPolicy",
    "TenantPolicies",
    "UpstreamFailed",
    "get_preset",
    "make_policy",
    "make_tenant_policy",
    "parse_vllm_metrics",
    "reading_reply",
    "with_failover",
]
