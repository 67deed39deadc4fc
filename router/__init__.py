"""Router: replica pool, health checks, vLLM metrics scraping, routing policies, failover."""

from router.assignments import AssignmentStore
from router.failover import UpstreamFailed, with_failover
from router.metrics import MetricsParseError, ReplicaMetrics, parse_vllm_metrics
from router.policies import (
    Decision,
    LeastLoadedPolicy,
    NoHealthyReplica,
    RoundRobinPolicy,
    RoutingPolicy,
    StickyPolicy,
    make_policy,
)
from router.pool import ReplicaPool
from router.replica import Replica

__all__ = [
    "AssignmentStore",
    "Decision",
    "LeastLoadedPolicy",
    "MetricsParseError",
    "NoHealthyReplica",
    "Replica",
    "ReplicaMetrics",
    "ReplicaPool",
    "RoundRobinPolicy",
    "RoutingPolicy",
    "StickyPolicy",
    "UpstreamFailed",
    "make_policy",
    "parse_vllm_metrics",
    "with_failover",
]
