"""Gateway configuration: one dataclass, filled from a TOML file, FOLDGATE_* env, or flags.

Every field has a default that works on one host: the embedded SQLite store, ReFold, sticky
routing, one default tenant.
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from router.knobs import ADMISSION_MAX_WAIT_S, ASSIGNMENT_TTL_S, REHOME_MARGIN

DEFAULT_TENANT = "default"


@dataclass(frozen=True)
class GatewayConfig:
    store_url: str | None = None
    """``redis://...`` for Redis; ``sqlite:///path`` or unset for the embedded SQLite store."""
    replicas: tuple[str, ...] = ()
    """Base URLs of the vLLM replicas (``http://host:port``)."""
    replica_dns: str | None = None
    """``host:port`` of a headless service whose A records are the replicas."""
    policy: str = "sticky_cost"
    """How sessions are routed to replicas: ``sticky_cost`` (the session -> replica map lives
    in the store; a session moves only when queueing on its replica costs more than
    re-prefilling its cached prefix elsewhere), ``sticky`` (moves when its replica's load
    exceeds the least loaded one's by ``rehome_margin``), ``round_robin`` or
    ``least_loaded``. A tenant's ``policy`` overrides it."""
    strategy: str = "refold"
    """Default context strategy: ``base``, ``refold``, ``cliff``, ``mask``, ``clip`` or a
    composition such as ``refold+cliff``; a tenant's ``strategy`` and the
    ``x-foldgate-strategy`` header override it."""
    fold: str = "auto"
    """ReFold's fold protocol: "auto" asks the model and stops after two ignored asks,
    "on" asks in the system prompt from the start (the paper), "off" only deduplicates."""
    k: int = 3
    """ReFold's chunk size: steps before the chunk boundary are rendered compressed, so the
    rendered prefix is rewritten once every ``k`` steps."""
    budget: int | None = None
    """Token budget of ``cliff`` (its compaction threshold, also in compositions); a tenant's
    ``budget`` overrides it. Unset: the context guard keeps each request below the replicas'
    context window instead."""
    session_header: str = "x-session-id"
    """Request header that names the session (before ``prompt_cache_key``,
    ``metadata.session_id``, Anthropic ``metadata.user_id`` and the digest fallback)."""
    strategy_header: str = "x-foldgate-strategy"
    """Request header that picks the context strategy for one request."""
    fold_header: str = "x-foldgate-fold"
    """Request header that picks ReFold's fold mode (auto, on, off) for one request."""
    api_keys: dict[str, str] = field(default_factory=dict)
    """API key hash (``sha256:<hex>``, from ``foldgate keys``) -> tenant. Empty: every
    request belongs to the default tenant."""
    tenants: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Tenant -> defaults and limits (``gateway.tenants.TenantSettings``); ``"*"`` for every
    tenant without a table of its own."""
    cache_salt_secret: str | None = None
    """Server secret for vLLM ``cache_salt`` per tenant; every gateway process of a
    deployment needs the same one. Unset: a random secret per process (a warning says so)."""
    tenant_fold: dict[str, str] = field(default_factory=dict)
    """Tenant -> ReFold fold mode, for tenants whose agents should not be asked (or should
    be asked from the start); the ``x-foldgate-fold`` header overrides it per request."""
    default_tenant: str = DEFAULT_TENANT
    """The tenant of every request when ``api_keys`` is empty."""
    upstream_model: str | None = None
    """Model name sent upstream; unset: the one model the replicas serve, else the client's."""
    max_body_bytes: int = 32 * 1024 * 1024
    """Largest request body accepted, in bytes; a larger one is a 413."""
    max_messages: int = 10_000
    """Conversation items (messages, Responses input items) one request may hold; more get
    a 413 before any is decoded, since every later step (decode, digest, render, the
    upstream body) costs time per item on the event loop. The longest recorded agent runs
    send under 500 (20x margin); a request at the limit still holds the loop a fifth as
    long as one of 50,000 did."""
    upstream_timeout_s: float = 600.0
    """Seconds to wait for a replica's first chunk (queueing and prefill); a generation may
    then run as long as chunks keep coming (``upstream_idle_timeout_s``)."""
    upstream_idle_timeout_s: float = 120.0
    """Seconds a replica may go silent between two chunks of one reply."""
    connect_timeout_s: float = 5.0
    """Seconds to open a connection to a replica; a failed connect is retried on another
    replica."""
    header_timeout_s: float = 5.0
    """Seconds a client has to send a request's headers (``foldgate serve``), from its
    connection (or, on a kept-alive one, from the request's first byte). Clients send the
    request line and headers in one write: 5 s covers two TCP retransmissions on a lossy
    link (1 s, then 2 s) and holds a connection that never finishes a third as long as
    the 15 s it once was."""
    header_connections_per_client: int = 64
    """Connections one peer address may have still sending their headers
    (``foldgate serve``); one more closes that peer's oldest. A client's connections pass
    this phase within a round trip, so even a busy host (or a proxy in front of the
    gateway) has a few in it at once."""
    header_connections_total: int = 512
    """Connections all peers together may have waiting for a request's headers
    (``foldgate serve``): still sending them, or idle between two requests. One more closes
    the oldest of them, so slow or idle connections from many addresses cannot take every
    file descriptor of the process. A complete request passes this phase within a round
    trip: only a burst of this many new connections within one could push it out."""
    body_timeout_s: float = 60.0
    """Seconds a client has to send a request's body."""
    keep_alive_s: float = 30.0
    """Seconds an idle client connection is kept open."""
    max_concurrency: int = 1024
    """Requests one gateway process serves at once (``foldgate serve``); more get a 503 in
    the endpoint's error shape with ``retry-after``. Connections still sending their
    headers or idle between requests do not count (``header_timeout_s``,
    ``header_connections_per_client``, ``header_connections_total``, ``keep_alive_s`` bound
    them)."""
    lease_period_s: float = 30.0
    """Seconds a request's slot among its tenant's ``concurrent_requests`` outlives the
    gateway process that holds it: each process renews its requests' leases every third of
    this while they run (a stream keeps its slot however long it runs), so a process that
    dies or loses the store frees its slots within this long."""
    max_restores: int = 3
    """Restores the gateway answers within one request (the model asked again after each);
    past it the reply goes to the harness as it is."""
    max_attempts: int = 3
    """Replicas one request is tried on when a replica fails before the first byte reached
    the client."""
    assignment_ttl_s: float = ASSIGNMENT_TTL_S
    """Seconds a session's replica assignment is kept in the store after its last use."""
    rehome_margin: float = REHOME_MARGIN
    """``sticky``: how many requests more than the least loaded replica a session's replica
    may carry before the session moves."""
    cost_model: str = "h200-qwen3.6-27b"
    """The replicas' cost preset (router/cost.py) that ``sticky_cost`` prices moves with."""
    upstream_priority: bool = False
    """Send vLLM's ``priority`` (lower runs first; the replicas need
    ``--scheduling-policy priority``, an fcfs replica ignores it): a continuing session whose
    prefix is warm on its replica ahead of a cold start, composed with the tenant's
    ``priority`` (``gateway.steps.priority``)."""
    admission: bool = False
    """Working-set admission: a request of a session outside its replica's working set (the
    sessions whose prefixes fit its KV pool) waits at the gateway, first come first served,
    at most ``admission_max_wait_s`` (``gateway.steps.working_set``)."""
    admission_max_wait_s: float = ADMISSION_MAX_WAIT_S
    """Longest admission wait; past it the request goes anyway (never refused), and the
    paused sessions vLLM evicts for it leave the set. Long enough for a member to finish or
    its reservation to end: a request that goes at 5 s overflows the pool."""
    admission_work_conserving: bool = True
    """With ``admission``: the first waiter for a replica goes before room comes when waiting
    would cost more than going, priced by ``cost_model``: the restores of the paused
    sessions it evicts, and its prefill's slowdown of the replica's running requests,
    against the soonest room can come, or once it has waited as long as going costs
    (``router.working_set.early_at``: members that keep coming back within their
    reservations hold it no longer); a replica whose members are
    all in their pauses then serves its waiters instead of idling. Where only running
    requests hold the room it goes at once, to vLLM's own queue, which admits it the moment
    one of them frees its blocks (vLLM never preempts a running request for a waiting one).
    Off: a waiter waits for room or the bound."""
    admission_price_fit: bool = False
    """With ``admission``: price those restores and prefills at what one uncached token
    costs on the replicas as they run now, the slope of the recent replies' time to first
    token against the tokens their replicas prefilled (``router.prefill_price``), instead of
    ``cost_model``'s fixed figure; the cost model's until enough replies are in. Off by
    default: on the pressure profile it measured a price ~2x ``cpu-tiny-loaded``'s and
    served less for it (docs/results/2026-12-02-kv-pressure-5.md)."""
    admission_growth_steps: int = 0
    """With ``admission``: a session entering a replica's working set goes only if the set
    keeps room for this many more steps of every member's growth (each the size its prompt
    grew by at its last step) and its own; 0: room for today's prompts only. A set filled
    to the pool overflows at its members' next steps and revokes the paused, who then
    re-prefill their whole prefix (``router.working_set.Headroom``)."""
    admission_trace: str = ""
    """With ``admission``: a file (relative: under ``$FOLDGATE_HOME``, else ``~/.foldgate``)
    each admission event is appended to as a JSON line, with the state its decision read
    (members, queue, room: ``gateway.steps.admission_trace``), to find out why a request
    waited; empty: none. For debugging: a line per decision."""
    admission_kv_fraction: float = 0.9
    """Share of a replica's KV pool the working set may fill (the rest absorbs decode
    growth and the estimates' error)."""
    kv_pool_tokens: int | None = None
    """A replica's KV pool in tokens, where its /metrics lacks ``vllm:cache_config_info``."""
    pause_reservation: bool = False
    """Keep a session's footprint reserved on its replica through its tool pause, for as long
    as its own pauses say it will be gone when re-prefilling it would cost more than an
    engine step (``router.working_set.reservation_s``); needs ``admission``. A reply that
    calls none of the tools its request offered ended the agent's turn (``router.turn_end``):
    no tool pause follows it, and nothing is reserved."""
    reservation_max_s: float = 120.0
    """Longest one reservation lasts; a session idle past its reservation releases it."""
    kv_events: bool = False
    """Subscribe to the replicas' vLLM KV events (ZMQ, ``--kv-events-config``) to know which
    of a session's blocks each replica still holds (``router.kv_events``). With them every
    request's prefill is sized (its prompt less what its replica holds) and counted on the
    replica until its first chunk: ``sticky_cost``'s queue wait weighs that backlog instead
    of counting queued requests alike."""
    kv_events_port_offset: int = 1000
    """A replica at ``http://host:port`` publishes its KV events on ``tcp://host:port+offset``."""
    kv_offload_bytes: int = 0
    """Each replica's CPU KV offload tier (vLLM ``--kv-offloading-size``), in bytes; 0: none.
    Evicted blocks then reload from it, which the cost model prices against a recompute."""
    probe_interval_s: float = 2.0
    """Seconds between health probes (and metrics scrapes) of each replica, and between
    re-resolutions of ``replica_dns``; two failed probes in a row take a replica out."""
    decode_cache_bytes: int = 128 * 1024 * 1024
    """Memory the per-session decode cache keeps, as estimated from each session's messages,
    tool calls and text (``gateway.request_cache.entry_bytes``, measured); the least recently
    used sessions are dropped past it."""
    digest_cache_bytes: int = 64 * 1024 * 1024
    """What the store's digest cache remembers of sessions' last requests (packed messages
    and their text, so that only a request's new messages are encoded and hashed), in
    bytes; the least recently used sessions are dropped past it."""
    render_cache_bytes: int = 512 * 1024 * 1024
    """Memory the per-session renderer caches keep, as estimated from each strategy's
    measured cost per byte of history text (``gateway.steps.render.cache_memory``: ReFold's
    cache takes 6-7x its session's text); the least recently used go past it. A session
    past it renders from scratch at its next request, so it is sized for the sessions a
    gateway serves at once: 512 MiB keeps ~150 ReFold sessions of 100k tokens
    (docs/results/2026-12-02-data-plane-2.md measures it)."""
    breaker_failures: int = 3
    """Failed requests in a row (connection error, 5xx, no first chunk, a reply broken off
    after its first chunk) that take a replica out; one failure does not."""
    breaker_open_s: float = 5.0
    """Seconds a replica stays out before trial requests (one at a time) may bring it back;
    each failed trial doubles it, up to ``breaker_max_open_s``."""
    breaker_max_open_s: float = 60.0
    """Longest time a replica stays out after failed trials (the doubling of
    ``breaker_open_s`` stops here)."""
    ui: bool = False
    """Serve the inspector page at ``/ui`` (sessions, and what the model saw at each step)."""
    debug: bool = False
    """Show clients the replicas' URLs (``x-foldgate-replica``, session listings) instead
    of opaque labels."""

    @classmethod
    def load(cls, path: str | Path | None = None, **overrides: Any) -> GatewayConfig:
        """File (TOML), then ``FOLDGATE_*`` environment variables, then explicit overrides."""
        values: dict[str, Any] = {}
        if path:
            values.update(tomllib.loads(Path(path).read_text()))
        known = {f.name: f for f in fields(cls)}
        unknown = set(values) - set(known)
        if unknown:
            raise ValueError(f"unknown config keys in {path}: {', '.join(sorted(unknown))}")
        for name in known:
            env = os.environ.get(f"FOLDGATE_{name.upper()}")
            if env is not None:
                values[name] = _from_env(name, env)
        values.update({k: v for k, v in overrides.items() if v is not None})
        if "replicas" in values:
            values["replicas"] = tuple(u.rstrip("/") for u in values["replicas"])
        return cls(**values)


def _from_env(name: str, raw: str) -> Any:
    if name == "replicas":
        return tuple(u for u in raw.split(",") if u)
    if name in {"api_keys", "tenant_fold"}:
        return dict(pair.split("=", 1) for pair in raw.split(",") if pair)
    if name == "tenants":
        return json.loads(raw)
    if name in {
        "k",
        "budget",
        "max_restores",
        "max_attempts",
        "max_concurrency",
        "header_connections_per_client",
        "header_connections_total",
        "max_messages",
        "breaker_failures",
        "kv_pool_tokens",
        "kv_events_port_offset",
        "admission_growth_steps",
    }:
        return int(raw)
    if name.endswith("_bytes"):  # max_body_bytes, the caches' bounds
        return int(raw)
    if name in {
        "ui",
        "debug",
        "upstream_priority",
        "admission",
        "pause_reservation",
        "kv_events",
        "admission_work_conserving",
        "admission_price_fit",
    }:
        return raw.strip().lower() in {"1", "true", "yes", "on"}
    if name.endswith("_s") or name in {"rehome_margin", "admission_kv_fraction"}:
        return float(raw)
    return raw
