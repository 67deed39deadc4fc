"""One admission path: a sequence of requests and reply ends (a session sends only when it
has no request waiting or running; a reply ends only when running), more sessions than the
pools hold, through the gateway's working-set step (``WorkingSetGate``: its
admission before routing, ``with_failover``, the move of a session's share at the first
chunk, the end of the reply) and through the simulator's (``SimRouting``, its held requests
asked again as ``offline.sim.cluster`` asks them: those the admission's ``wake`` names)
admits the same requests, for the same replicas, in the same order and at the same times
as asking every held request again at every reply end, in arrival order (what both did
before the admission named the waiters that may go)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace

from gateway.steps.working_set import Ticket, WorkingSetGate
from offline.sim.assignments import MemoryAssignments
from offline.sim.routing import Routed, SimRouting
from router import ReplicaMetrics, ReplicaPool, get_preset, make_policy
from router.failover import with_failover
from router.replica import Replica
from router.session_route import route_hints
from router.working_set_admission import WorkingSetAdmission
from store import Assign

TENANT = "acme"
URLS = [f"http://replica-{i}:8000" for i in range(2)]
POOL_TOKENS = 10_000


@dataclass(frozen=True)
class Send:
    session: str
    tokens: int


@dataclass(frozen=True)
class End:
    session: str


Admitted = tuple[int, str, str, str]  # event index, session, replica, outcome


def script() -> list[Send | End]:
    """Eight sessions of 3,000-4,000 tokens on two pools of 10,000: some wait for others'
    replies to end."""
    events: list[Send | End] = []
    sessions = [f"s{i}" for i in range(8)]
    for turn in range(3):
        for i, s in enumerate(sessions):
            events.append(Send(s, 3_000 + 150 * i + 400 * turn))
        for s in sessions:
            events.append(End(s))
    return events


def pool() -> ReplicaPool:
    built = ReplicaPool(URLS)
    for r in built.replicas:
        r.healthy = True
        r.metrics = ReplicaMetrics(running=0, waiting=0, kv_cache_usage=0.0)
    return built


def admission() -> WorkingSetAdmission:
    # Without reservations a waiter's only timeout is its deadline, far past the script:
    # the gateway's waiters then wake on the admission's changes alone, never on the
    # wall clock (the test's clock is the event index). Waiting for room (work_conserving
    # off): with no paused members, a priced waiter would go at once.
    return WorkingSetAdmission(
        get_preset("cpu-tiny"), max_wait_s=1e6, reserve=False, pool_tokens=POOL_TOKENS,
        work_conserving=False,
    )  # fmt: skip


async def through_the_gateway(events: list[Send | End]) -> list[Admitted]:
    clock = [0.0]
    assignments = MemoryAssignments()
    policy = make_policy("sticky_cost", assignments=assignments, cost=get_preset("cpu-tiny"))
    replicas = pool()
    gate = WorkingSetGate(admission(), replicas, clock=lambda: clock[0])
    admitted: list[Admitted] = []
    running: dict[str, tuple[Ticket, Replica]] = {}
    waiting: list[asyncio.Task[None]] = []
    busy: set[str] = set()  # sessions with a request waiting or running

    async def request(session: str, tokens: int) -> None:
        home = assignments.read(TENANT, session)
        ticket = await gate.admit(TENANT, session, home, tokens)

        async def attempt(replica: Replica) -> Replica:
            gate.started(ticket, replica.url)  # the first chunk: accepted
            assert ticket.request is not None
            assignments.write(TENANT, session, _assign(replica.url, home))
            return replica

        # The pipeline's hints (gateway.steps.route.hints), placed where admission counted
        # the session (gateway.steps.kv: RouteHints.admitted).
        hints = route_hints(
            policy, TENANT, prompt_tokens=tokens, last_prompt_tokens=None, assignment=home,
            prefix=lambda: None,
        )  # fmt: skip
        if ticket.request is not None:
            hints = replace(hints, admitted=ticket.request.replica)
        replica = await with_failover(policy, replicas, TENANT, session, attempt, hints=hints)
        replica.started()  # in flight until the reply's end
        assert ticket.request is not None
        admitted.append((int(clock[0]), session, ticket.request.replica, ticket.outcome))
        running[session] = (ticket, replica)

    async def settle() -> None:
        for _ in range(20):  # every woken waiter asks again and, admitted, routes
            await asyncio.sleep(0)

    for now, event in enumerate(events):
        clock[0] = float(now)
        if isinstance(event, Send):
            if event.session not in busy:
                busy.add(event.session)
                waiting.append(asyncio.create_task(request(event.session, event.tokens)))
        elif event.session in running:
            busy.discard(event.session)
            ticket, replica = running.pop(event.session)
            replica.ended()
            gate.finish(ticket, served=True)
        await settle()
    for task in waiting:
        task.cancel()
    return admitted


def _assign(url: str, expected: str | None) -> Assign:
    return Assign(url, expected=expected, ttl_s=3600.0)


def through_the_simulator(events: list[Send | End], *, ask_all: bool = False) -> list[Admitted]:
    """``ask_all``: at a reply end ask every held request again in arrival order, not only
    those the admission names."""
    assignments = MemoryAssignments()
    policy = make_policy("sticky_cost", assignments=assignments, cost=get_preset("cpu-tiny"))
    replicas = pool()
    admission_ = admission()
    routing = SimRouting(policy, replicas, assignments, admission_)
    admitted: list[Admitted] = []
    running: dict[str, Routed] = {}
    held: dict[tuple[str, str], Routed] = {}

    def go(routed: Routed, now: int, outcome: str) -> None:
        routing.route(routed)
        routing.accepted(routed, float(now))
        assert routed.admitted is not None
        admitted.append((now, routed.session, routed.admitted.replica, outcome))
        running[routed.session] = routed

    def ask(key: tuple[str, str], now: int) -> None:
        routed = held[key]
        verdict = routing.admit(routed, float(now))
        if verdict.admit:
            del held[key]
            go(routed, now, verdict.reason)

    def admit_held(now: int) -> None:
        if ask_all:
            for key in list(held):
                ask(key, now)
        else:  # as offline.sim.cluster does
            admission_.wake(lambda key: ask(key, now))

    for now, event in enumerate(events):
        if isinstance(event, Send):
            if event.session in running or (TENANT, event.session) in held:
                continue
            routed = routing.prepare(
                TENANT, event.session, prompt_tokens=event.tokens, last_prompt_tokens=None,
                prefix=None, now=float(now),
            )  # fmt: skip
            verdict = routing.admit(routed, float(now))
            if verdict.admit:
                go(routed, now, verdict.reason)
            else:
                held[(TENANT, event.session)] = routed
        elif event.session in running:
            routing.ended(running.pop(event.session), float(now))
            admit_held(now)
    return admitted


async def test_the_gateway_and_the_simulator_admit_alike() -> None:
    events = script()
    gateway = await through_the_gateway(events)
    simulated = through_the_simulator(events)
    assert simulated == gateway
    assert through_the_simulator(events, ask_all=True) == gateway
    outcomes = {outcome for *_, outcome in gateway}
    assert "waited" in outcomes, "the script should make requests wait"
    assert {replica for _, _, replica, _ in gateway} == set(URLS)
