"""One routing path: a sequence of arrivals, completions and scrapes replayed through the
gateway's request path (its store lookup, ``gateway.steps.route``, ``with_failover``, the
history write with the assignment, the accounting of the last prompt) and through the
simulator's (``offline.sim.routing.SimRouting``, as ``offline.sim.cluster`` drives it) makes
the same decisions, moves and assignments, for every policy the gateway offers."""

from __future__ import annotations

import uuid
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.fold.renderer import RenderStats
from gateway.fold.spec import parse_spec
from gateway.identity import Caller
from gateway.request_cache import Decoded
from gateway.steps import route
from gateway.steps.ingest import lookup, store_history
from gateway.steps.render_call import Rendering
from gateway.transcript import Message, Text, Transcript
from offline.sim.assignments import MemoryAssignments
from offline.sim.routing import Routed, SimRouting
from router import (
    POLICY_NAMES,
    Decision,
    ReplicaMetrics,
    ReplicaPool,
    RouteHints,
    RoutingPolicy,
    get_preset,
    make_policy,
)
from router.failover import with_failover
from router.replica import Replica
from router.session_route import shared_prefix
from store import open_store

TENANT = "acme"
URLS = [f"http://replica-{i}:8000" for i in range(3)]
TOOLS = {
    "a": ({"type": "function", "function": {"name": "bash", "parameters": {}}},),
    "b": ({"type": "function", "function": {"name": "edit", "parameters": {}}},),
}


@dataclass(frozen=True)
class Send:
    session: str
    agent: str  # whose tools and system prompt
    steps: int  # how many turns the history has


@dataclass(frozen=True)
class End:
    session: str


@dataclass(frozen=True)
class Scrape:
    running: tuple[float, ...]
    kv: tuple[float, ...]


def transcript(event: Send) -> Transcript:
    messages = [Message("system", (Text(f"You are agent {event.agent}. " * 40),))]
    for step in range(event.steps):
        messages.append(Message("user", (Text(f"{event.session} task, turn {step} " * 30),)))
        messages.append(Message("assistant", (Text(f"done {step} " * 20),)))
    messages.append(Message("user", (Text(f"{event.session} next " * 10),)))
    return Transcript(tuple(messages), tools=TOOLS[event.agent])


def script() -> list[Send | End | Scrape]:
    """Six sessions of two agents over three replicas; one replica turns busy by scrape,
    so load-driven policies move sessions, and then idle again."""
    events: list[Send | End | Scrape] = [Scrape((0, 0, 0), (0.0, 0.0, 0.0))]
    steps = dict.fromkeys([f"s{i}" for i in range(6)], 0)
    for turn in range(4):
        for i, session in enumerate(steps):
            events.append(Send(session, "ab"[i % 2], steps[session]))
            if i % 2:  # every other request is still running when the next arrives
                events.append(End(session))
        for session in list(steps)[::2]:
            events.append(End(session))
        for session in steps:
            steps[session] += 1
        if turn == 1:
            events.append(Scrape((20, 1, 2), (0.97, 0.3, 0.2)))
        if turn == 2:
            events.append(Scrape((0, 0, 1), (0.4, 0.3, 0.2)))
    return events


def pool() -> ReplicaPool:
    built = ReplicaPool(URLS)
    for r in built.replicas:
        r.healthy = True
    return built


def scrape(p: ReplicaPool, event: Scrape) -> None:
    for r, running, kv in zip(p.replicas, event.running, event.kv, strict=True):
        r.metrics = ReplicaMetrics(running=running, waiting=0, kv_cache_usage=kv)


Decided = tuple[str, str, str, str | None, str | None]  # session, url, reason, moved, assigned


class Recorded:
    """The gateway's policy, its decisions recorded (a RoutingPolicy around it)."""

    def __init__(self, inner: RoutingPolicy) -> None:
        self.inner = inner
        self.name = inner.name
        self.uses_cached_prefix = inner.uses_cached_prefix
        self.uses_shared_prefix = inner.uses_shared_prefix
        self.made: list[Decision] = []

    def policy_for(self, tenant: str) -> RoutingPolicy:
        return self.inner

    async def choose(
        self,
        tenant: str,
        session: str,
        pool: ReplicaPool,
        exclude: Collection[str] = (),
        hints: RouteHints | None = None,
    ) -> Decision:
        made = await self.inner.choose(tenant, session, pool, exclude, hints)
        self.made.append(made)
        return made


async def through_the_gateway(
    name: str, events: list[Send | End | Scrape], db: Path
) -> list[Decided]:
    store = open_store(f"sqlite://{db}")
    policy = make_policy(name, assignments=store, cost=get_preset("cpu-tiny"))
    recorded = Recorded(policy)
    replicas = pool()
    caller = Caller(TENANT, parse_spec("base"), "auto", budget=None, max_bytes=None)
    decided: list[Decided] = []
    open_requests: dict[str, tuple[Replica, int, int]] = {}
    try:
        for event in events:
            if isinstance(event, Scrape):
                scrape(replicas, event)
                continue
            if isinstance(event, End):
                replica, branch, tokens = open_requests.pop(event.session)
                replica.ended()  # the restore loop's track() ends with the reply
                await store.add_counts(  # the accounting step: the last prompt's size
                    TENANT,
                    event.session,
                    branch,
                    {"requests": 1},
                    token=uuid.uuid4().hex,
                    latest={route.LAST_PROMPT: tokens},
                )
                continue
            decoded = Decoded.full(transcript(event))
            ingested = await lookup(store, caller, event.session, decoded, stream=True)
            rendering = Rendering(decoded.transcript, decoded.tokens, RenderStats(), 0.0, None)
            hints = route.hints(policy, ingested, rendering, ingested.found.assignment)
            written: list[tuple[int, str | None]] = []

            async def attempt(replica: Replica, ingested=ingested, written=written) -> Replica:
                assign = route.assignment(policy, ingested, replica, ingested.found.assignment)
                stored = await store_history(store, ingested, assign)
                written.append((stored.branch, stored.assignment))
                return replica

            replica = await with_failover(
                recorded, replicas, TENANT, event.session, attempt, hints=hints, streamed=True
            )
            replica.started()  # the restore loop's track() over the rest of the reply
            branch, assigned = written[-1]
            open_requests[event.session] = (replica, branch, decoded.tokens)
            made = recorded.made[-1]
            decided.append((event.session, replica.url, made.reason, made.moved_from, assigned))
    finally:
        await store.close()
    return decided


def through_the_simulator(name: str, events: list[Send | End | Scrape]) -> list[Decided]:
    assignments = MemoryAssignments()
    policy = make_policy(name, assignments=assignments, cost=get_preset("cpu-tiny"))
    replicas = pool()
    routing = SimRouting(policy, replicas, assignments, None)
    decided: list[Decided] = []
    open_requests: dict[str, Routed] = {}
    last_prompt: dict[str, int] = {}
    for now, event in enumerate(events):
        if isinstance(event, Scrape):
            scrape(replicas, event)
            continue
        if isinstance(event, End):
            routed = open_requests.pop(event.session)
            routing.ended(routed, float(now))
            continue
        sent = transcript(event)
        tokens = Decoded.full(sent).tokens
        routed = routing.prepare(
            TENANT,
            event.session,
            prompt_tokens=tokens,
            last_prompt_tokens=last_prompt.get(event.session),
            # What offline.sim.workload computes for each rendered step.
            prefix=shared_prefix(TENANT, sent),
            now=float(now),
        )
        assert routing.admit(routed, float(now)).admit
        routing.route(routed)
        routing.accepted(routed, float(now))  # the first token
        last_prompt[event.session] = tokens
        open_requests[event.session] = routed
        d = routed.decision
        assert d is not None
        assigned = assignments.read(TENANT, event.session)
        decided.append((event.session, d.replica.url, d.reason, d.moved_from, assigned))
    return decided


@pytest.mark.parametrize("name", POLICY_NAMES)
async def test_the_gateway_and_the_simulator_route_alike(name: str, tmp_path: Path) -> None:
    events = script()
    gateway = await through_the_gateway(name, events, tmp_path / "store.db")
    simulated = through_the_simulator(name, events)
    assert simulated == gateway
    assert len(gateway) == 24
    if name in ("sticky", "sticky_cost"):
        reasons = {reason for _, _, reason, _, _ in gateway}
        assert {"new", "sticky"} <= reasons
        assert reasons - {"new", "sticky"}, "the script should move a session"


def test_the_simulator_counts_a_sized_prefill_until_its_first_token() -> None:
    """The gateway's attempt counts its prefill (sized by the KV events' figures) on its
    replica until the first chunk (``Replica.prefill``); the simulator's path counts it
    until the first token."""
    assignments = MemoryAssignments()
    policy = make_policy("sticky_cost", assignments=assignments, cost=get_preset("cpu-tiny"))
    replicas = pool()
    routing = SimRouting(policy, replicas, assignments, None)

    def send(resident: dict[str, int] | None) -> Routed:
        routed = routing.prepare(
            TENANT, "s", prompt_tokens=5000, last_prompt_tokens=None, prefix=None, now=0.0,
            resident=resident,
        )  # fmt: skip
        routing.route(routed)
        return routed

    routed = send({url: 3000 for url in URLS})
    replica = routed.replica
    assert (replica.in_flight, replica.prefilling, replica.prefill_backlog_tokens) == (1, 1, 2000)
    routing.accepted(routed, 1.0)  # the first token: its prefill is done
    assert (replica.in_flight, replica.prefilling, replica.prefill_backlog_tokens) == (1, 0, 0)
    routing.ended(routed, 2.0)
    assert replica.in_flight == 0
    # Without the KV events nothing is sized.
    unsized = send(None)
    assert (unsized.replica.prefilling, unsized.replica.prefill_backlog_tokens) == (0, 0)
