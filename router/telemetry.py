"""Prometheus series for routing, on the default registry the gateway's /metrics exposes."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

ROUTING_DECISIONS = Counter(
    "foldgate_router_decisions",
    "Routing decisions, by policy and reason.",
    ["policy", "reason"],
)
SESSION_MOVES = Counter(
    "foldgate_router_session_moves",
    "Sessions re-homed from one replica to another, by policy and reason.",
    ["policy", "reason"],
)
FAILOVER_RETRIES = Counter(
    "foldgate_router_failover_retries",
    "Requests retried on another replica after an upstream failure before the first byte.",
)
REPLICA_HEALTHY = Gauge(
    "foldgate_router_replica_healthy",
    "1 when the replica passed its last health check, else 0.",
    ["replica"],
)
BREAKER_STATE = Gauge(
    "foldgate_router_breaker_state",
    "The replica's circuit breaker: 0 closed (routed), 1 half-open (one trial request at a "
    "time), 2 open (not routed).",
    ["replica"],
)
BREAKER_OPENED = Counter(
    "foldgate_router_breaker_opened",
    "Times the replica's circuit breaker opened (failed requests in a row, or a failed trial).",
    ["replica"],
)
