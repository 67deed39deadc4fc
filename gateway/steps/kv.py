"""KV: what the request path does for the replicas' KV pools, between route and forward.

Three switches of ``GatewayConfig``, each off by default and each a no-op when off (the
request goes exactly as without this step):

- ``kv_events``: the replicas' KV events (``router.kv_subscriber``) say how much of the
  session's last prefix each replica holds; the routing hints carry it (the session's own
  replica's figure as its cached prefix, the others' for ``kv_resident``), and every
  upstream request names its session (``session_id``: ``router.kv_events.session_key``).
- ``admission`` (+ ``pause_reservation``): the working-set wait
  (``gateway.steps.working_set``); the replica it admitted the request to is the one the
  policy routes to while that is routable (``RouteHints.admitted``).
- ``upstream_priority``: vLLM's ``priority`` (``gateway.steps.priority``), warm when the
  session is continuing on its replica and its prefix is there as far as the gateway
  knows (its working-set membership or the events' figure; else that it continues).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gateway.config import GatewayConfig
from gateway.steps.admission_trace import AdmissionTrace, trace_path
from gateway.steps.ingest import Ingested
from gateway.steps.priority import set_priority, tenant_base, upstream_priority
from gateway.steps.route import LAST_PROMPT
from gateway.steps.working_set import Ticket, WorkingSetGate
from gateway.tenants import Tenants
from router import ReplicaPool, RouteHints
from router.admission_seam import FirstToken, binds_placement
from router.cost import CostModel, get_preset
from router.kv_events import session_key
from router.kv_subscriber import KvEventSubscriber
from router.session_route import session_warm, with_resident
from router.working_set_admission import WorkingSetAdmission

SESSION_FIELD = "session_id"


@dataclass(frozen=True, slots=True)
class Placement:
    """What this step decided for one request before it goes upstream."""

    key: str
    hints: RouteHints
    warm: bool
    ticket: Ticket | None

    @property
    def wait_s(self) -> float:
        return self.ticket.wait_s if self.ticket is not None else 0.0

    @property
    def admission(self) -> str:
        """How working-set admission let the request go (``Ticket.outcome``); ``off``
        without admission."""
        return self.ticket.outcome if self.ticket is not None else "off"


def first_token(
    usage: Sequence[Mapping[str, Any]], first_chunk_s: float | None
) -> FirstToken | None:
    """What an answered reply says of its replica's prefill: the prompt tokens its usage
    counts less those served from the prefix cache, and the seconds from the send to the
    first chunk (vLLM streams nothing before the first token). Only for a reply of one
    upstream request whose usage reports the cached share (vLLM's
    ``--enable-prompt-tokens-details``): a restore's or a failover's times mix requests."""
    if first_chunk_s is None or len(usage) != 1:
        return None
    prompt = usage[0].get("prompt_tokens")
    details = usage[0].get("prompt_tokens_details")
    if not isinstance(prompt, int) or not isinstance(details, dict):
        return None
    cached = details.get("cached_tokens") or 0
    return (prompt - cached, first_chunk_s) if isinstance(cached, int) else None


def replica_tokens(ingested: Ingested, hints: RouteHints) -> int:
    """The rendered prompt in the replica's tokens: the gateway's estimate (bytes / 4)
    scaled by what the replica counted of this session's earlier prompts against the
    estimates of them (the store's branch counters); the estimate itself for a new one."""
    counts = ingested.found.counts
    estimated, counted = counts.get("rendered_tokens", 0), counts.get("upstream_prompt_tokens", 0)
    if estimated <= 0 or counted <= 0:
        return hints.prompt_tokens
    return round(hints.prompt_tokens * counted / estimated)


def cost_model(config: GatewayConfig) -> CostModel:
    """The replicas' cost preset, with their CPU offload tier when they have one."""
    return get_preset(config.cost_model).with_offload(config.kv_offload_bytes)


class KvControl:
    def __init__(self, config: GatewayConfig, pool: ReplicaPool, tenants: Tenants) -> None:
        self.config = config
        self.pool = pool
        self.tenants = tenants
        self.gate = None
        if config.admission:
            admission = WorkingSetAdmission(
                cost_model(config),
                fraction=config.admission_kv_fraction,
                max_wait_s=config.admission_max_wait_s,
                reserve=config.pause_reservation,
                reservation_max_s=config.reservation_max_s,
                pool_tokens=config.kv_pool_tokens,
                work_conserving=config.admission_work_conserving,
                price_fit=config.admission_price_fit,
                growth_steps=config.admission_growth_steps,
            )
            trace = None
            if config.admission_trace:
                trace = AdmissionTrace(trace_path(config.admission_trace), admission)
            self.gate = WorkingSetGate(admission, pool, trace=trace)
        self.events = KvEventSubscriber(config.kv_events_port_offset) if config.kv_events else None

    def resident(self, ingested: Ingested, key: str) -> dict[str, int] | None:
        """Per routable replica, the tokens of the session's last prefix it holds (only
        replicas whose events named the session); None without events."""
        if self.events is None:
            return None
        salt = self.tenants.cache_salt(ingested.tenant)
        found: dict[str, int] = {}
        for replica in self.pool.routable():
            tokens = self.events.index(replica.url).resident_tokens(key, salt)
            if tokens is not None:
                found[replica.url] = tokens
        return found

    async def place(self, ingested: Ingested, hints: RouteHints) -> Placement:
        """The routing hints with what the KV events say, whether the session is warm, and
        its working-set admission (waits here)."""
        key = session_key(ingested.tenant, ingested.session)
        home = ingested.found.assignment
        last = ingested.found.counts.get(LAST_PROMPT)
        resident = self.resident(ingested, key)
        tokens = replica_tokens(ingested, hints)
        if resident is not None:
            # The events count the replica's tokens: so does the prompt they are taken
            # from (what the request prefills there, ``router.session_route.
            # prefill_estimate``).
            hints = replace(hints, prompt_tokens=tokens)
        hints = with_resident(hints, home, resident)
        gate = self.gate
        holds = (
            (lambda: gate.holds(ingested.tenant, ingested.session, home or ""))
            if gate is not None
            else None
        )
        warm = session_warm(home, last, resident, holds)
        ticket = None
        if self.gate is not None:
            ticket = await self.gate.admit(ingested.tenant, ingested.session, home, tokens)
            request = ticket.request
            if request is not None and binds_placement(request, ticket.outcome):
                hints = replace(hints, admitted=request.replica)  # where its set counted it
        return Placement(key, hints, warm, ticket)

    def scope(self, body: MutableMapping[str, Any], ingested: Ingested, placed: Placement) -> int:
        """The upstream body's fields of this step: the session's name for the KV events,
        the priority (returned; 0 when not sent)."""
        if self.events is not None:
            body[SESSION_FIELD] = placed.key
        if not self.config.upstream_priority:
            return 0
        configured = self.tenants.settings(ingested.tenant).priority
        priority = upstream_priority(tenant_base(body, configured), placed.warm)
        set_priority(body, priority, placed.warm)
        return priority

    def started(self, placed: Placement, replica_url: str) -> None:
        if self.gate is not None and placed.ticket is not None:
            self.gate.started(placed.ticket, replica_url)

    def finish(
        self,
        placed: Placement,
        *,
        served: bool,
        first_token: FirstToken | None = None,
        pausing: bool = True,
    ) -> None:
        """The request's reply ended (``served``) or it failed; ``pausing``: as
        ``WorkingSetGate.finish``'s."""
        if self.gate is not None and placed.ticket is not None:
            self.gate.finish(placed.ticket, served=served, first_token=first_token, pausing=pausing)

    async def close(self) -> None:
        if self.events is not None:
            await self.events.close()
        if self.gate is not None and self.gate.trace is not None:
            self.gate.trace.close()
