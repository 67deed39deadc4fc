"""Router: replica pool, health checks, vLLM metrics scraping, routing policies, failover."""

from router.assignments import AssignmentStore
from router.cost import PRESETS as COST_PRESETS
from router.cost import CostModel, get_preset
from router.failover import UpstreamFailed, reading_reply, with_failover
from router.metrics import MetricsParseError, ReplicaMetrics, parse_vllm_metrics
from router.policies import (
    POLICY_NAMES,
    AssignedSessionPolicy,
    CostAwareStickyPolicy,
    Decision,
    LeastLoadedPolicy,
    NoHealthyReplica,
    RoundRobinPolicy,
    RouteHints,
    RoutingPolicy,
    StickyPolicy,
    make_policy,
)
from router.pool import ReplicaPool
from router.replica import Replica
from router.tenant_policies import TenantPolicies, make_tenant_policy

__all__ = [
    "COST_PRESETS",
    "POLICY_NAMES",
    "AssignedSessionPolicy",
    "AssignmentStore",
    "CostAwareStickyPolicy",
    "CostModel",
    "Decision",
    "LeastLoadedPolicy",
    "MetricsParseError",
    "NoHealthyReplica",
    "Replica",
    "ReplicaMetrics",
    "ReplicaPool",
    "RoundRobinPolicy",
    "RouteHints",
    "RoutingPolicy",
    "StickyPolicy",
    "TenantPolicies",
    "UpstreamFailed",
    "get_preset",
    "make_policy",
    "make_tenant_policy",
    "parse_vllm_metrics",
    "reading_reply",
    "with_failover",
]
