"""The discrete-event cluster: sessions replaying trajectories, the real routing policy,
R modelled vLLM replicas.

Agent sessions arrive at a fixed concurrency (a finished session is replaced at once) or
as a Poisson process. Each replays one trajectory step by step: it sends a request, waits
for the whole reply, "runs the tool" for an exponentially distributed think time, and sends
the next. Every request is routed along the gateway's own path (``offline.sim.routing``:
the assignment read with the history, the same hints, the policy ``router.make_policy``
builds deciding, the admission seam, the in-flight count, the assignment written at the
first token) against a ``ReplicaPool`` whose replicas carry what the gateway would see: the
last scrape of each engine (running, waiting, KV usage; every ``scrape_interval_s``) and the
gateway's own in-flight count. A request the admission seam holds back waits at the
gateway, first come first served, and is asked again at its ``retry_at`` and, when a
reply ends, if the admission names it among those that may go (``Admission.wake``).

Everything random comes from the seed: session s draws its trajectory and think times from
its own generator, so two cells (policies, strategies) with one seed replay the same
sessions with the same pauses and differ only in what the cell changes. Replica i draws
its step-time jitter (the cost model's ``step_jitter``) from a generator of its own, seeded
by the seed and i.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from gateway.config import GatewayConfig
from offline.sim.assignments import MemoryAssignments
from offline.sim.engine import SimReplica, SimRequest
from offline.sim.result import CellResult, RequestRecord
from offline.sim.routing import Routed, SimRouting
from offline.sim.workload import SIM_TENANT, Workload
from offline.think_time import ThinkTime
from router import ReplicaMetrics, ReplicaPool, make_policy
from router.cost import CostModel
from router.knobs import ADMISSION_MAX_WAIT_S, Knobs
from router.policies import PrefixTreePolicy
from router.registry import ADMISSIONS

_STEP_END, _SEND, _SCRAPE, _ARRIVE, _ENQUEUE, _RETRY = range(6)


@dataclass(frozen=True, slots=True)
class SimConfig:
    policy: str
    strategy: str
    cost: CostModel
    replicas: int = 8
    concurrency: int | None = 256  # fixed concurrency, or None with arrival_rate
    arrival_rate: float | None = None  # sessions per second (Poisson)
    duration_s: float = 900.0
    warmup_s: float = 120.0
    think_s: float = 5.0
    # 0: think times exponential with mean ``think_s``; else lognormal with median
    # ``think_s`` and this sigma (the Locust harness's fallback draw, ``--think-time M:S``).
    think_sigma: float = 0.0
    # None: every think time drawn as above. Else a recording replayed as the Locust harness
    # replays it: the gap the trajectory logged before the request (``Step.think_s``), cut
    # to this many seconds, and the draw where it logged none (``think_time``).
    think_cap_s: float | None = None
    scrape_interval_s: float = 2.0
    seed: int = 0
    sessions: int | None = None  # stop starting sessions after this many
    shuffle: bool = True  # sessions take the trajectories in a seeded order, else as given
    # (session, step) -> replica index, as a measured run routed them: replaces the policy's
    # choice, so a calibration can check the replica model apart from the routing, whose
    # burst placement and round-robin interleaving follow the real run's timing.
    routes: Mapping[tuple[int, int], int] | None = None
    # (session, step) -> the earliest time it is sent, as a measured run sent it (seconds
    # from its first request): with ``routes``, the run's schedule, so which requests share
    # a replica's pool at a time is the run's too.
    send_times: Mapping[tuple[int, int], float] | None = None
    # The admission seam's implementation (``router.registry.ADMISSIONS``).
    admission: str = "off"
    # The gateway's ``upstream_priority`` with the replicas on vLLM's priority scheduling.
    priority: bool = False
    # The gateway's ``kv_events``: what each replica holds of a session's last prompt,
    # here exactly (the simulator knows its blocks), in the hints.
    kv_events: bool = False
    # With ``admission``: the gateway's ``admission_max_wait_s`` and ``pause_reservation``.
    admission_max_wait_s: float = ADMISSION_MAX_WAIT_S
    pause_reservation: bool = True
    # Keep every measured request's record (``CellResult.request_log``).
    log_requests: bool = False

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.arrival_rate is None):
            raise ValueError("give exactly one of concurrency and arrival_rate")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.arrival_rate is not None and self.arrival_rate <= 0:
            raise ValueError(f"arrival_rate must be positive, got {self.arrival_rate}")
        if self.replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {self.replicas}")
        if not 0 <= self.warmup_s < self.duration_s:
            raise ValueError("need 0 <= warmup_s < duration_s")
        if self.think_s < 0 or self.think_sigma < 0 or self.scrape_interval_s <= 0:
            raise ValueError("think_s must be >= 0 and scrape_interval_s positive")
        if self.think_cap_s is not None and self.think_cap_s < 0:
            raise ValueError(f"think_cap_s must be >= 0, got {self.think_cap_s}")
        if self.sessions is not None and self.sessions < 1:
            raise ValueError(f"sessions must be >= 1, got {self.sessions}")
        if self.admission not in ADMISSIONS:
            known = ", ".join(sorted(ADMISSIONS))
            raise ValueError(f"unknown admission {self.admission!r}; known: {known}")

    @property
    def think_time(self) -> ThinkTime:
        """The think-time rule of ``think_s``, ``think_sigma`` and ``think_cap_s``."""
        recorded = self.think_cap_s is not None
        return ThinkTime(
            self.think_s,
            self.think_sigma or None,
            cap_s=self.think_cap_s if self.think_cap_s is not None else 0.0,
            recorded=recorded,
        )

    @property
    def load(self) -> str:
        if self.concurrency is not None:
            return f"{self.concurrency} concurrent"
        return f"{self.arrival_rate:g}/s Poisson"


@dataclass(slots=True)
class _Session:
    index: int
    seed: int
    trajectory: str
    rng: random.Random
    base: int  # offset of its own block ids
    step: int = 0
    last_prompt: int | None = None
    last_ids: np.ndarray | None = None  # its last prompt's block ids

    @property
    def key(self) -> str:
        """Its session id: salted by the seed, so a policy that hashes session ids (a hash
        ring, a rendezvous tie-break) draws another placement with each seed, as a real
        run's session ids are a draw of their own."""
        return f"{self.seed}:{self.index}"


def simulate(
    workload: Workload, config: SimConfig, on_progress: Callable[[float], None] | None = None
) -> CellResult:
    """Run one cell; ``on_progress(simulated seconds)`` is called as time advances."""
    cost = config.cost
    if cost.block_size != workload.block_size:
        raise ValueError(
            f"workload blocks are {workload.block_size} tokens, cost model "
            f"{cost.name!r} has {cost.block_size}"
        )
    return _Cluster(workload, config).run(on_progress)


class _Cluster:
    """One cell in progress: the replicas and the gateway's view of them, the policy, the
    live sessions, the event queue, and what is measured. Each event is one method."""

    def __init__(self, workload: Workload, config: SimConfig) -> None:
        self.workload, self.config, self.cost = workload, config, config.cost
        self.think_time = config.think_time
        urls = [f"http://sim-replica-{i}:8000" for i in range(config.replicas)]
        self.pool = ReplicaPool(urls)
        for r in self.pool.replicas:
            r.healthy = True
            r.metrics = ReplicaMetrics(running=0, waiting=0, kv_cache_usage=0.0)
        self.index_of = {u: i for i, u in enumerate(urls)}
        self.assignments = MemoryAssignments()
        self.now = 0.0
        knobs = {"cost": self.cost, "rehome_margin": GatewayConfig.rehome_margin}
        self.policy = make_policy(
            config.policy,
            assignments=self.assignments,
            clock=lambda: self.now,
            # The gateway's own default, so "sticky" is sticky as deployed today.
            **knobs,
        )
        # "off": the gateway asks nothing (no working-set step).
        admission_knobs = Knobs(
            **knobs,
            admission_max_wait_s=config.admission_max_wait_s,
            pause_reservation=config.pause_reservation,
        )
        admission = (
            None if config.admission == "off" else ADMISSIONS[config.admission](admission_knobs)
        )
        self.routing = SimRouting(
            self.policy, self.pool, self.assignments, admission, priority=config.priority
        )
        self.reads_chain = isinstance(self.policy, PrefixTreePolicy)
        # Each session's request in flight (a session has one at a time), and the routed
        # requests the admission seam holds at the gateway: (tenant, session) -> the
        # request and when its own timer asks again.
        self.routed: dict[int, Routed] = {}
        self.held: dict[tuple[str, str], tuple[Routed, SimRequest, float | None]] = {}
        self.engines = [
            SimReplica.create(i, self.cost, config.seed, priority=config.priority)
            for i in range(config.replicas)
        ]
        self.events: list[tuple[float, int, int, int, int]] = []
        self.seq = 0
        self.sessions: dict[int, _Session] = {}
        self.next_id = workload.shared_ids
        self.started = 0
        self.arrivals = random.Random(config.seed)
        self.result = CellResult(
            policy=config.policy,
            strategy=config.strategy,
            load=config.load,
            window_s=config.duration_s - config.warmup_s,
            requests=0,
            prefix_queries=0,
            prefix_hits=0,
            queue_s=[],
            ttft_s=[],
            preemptions=0,
            moves=0,
            sessions_started=0,
        )
        self.order = session_order(workload, config.seed, shuffle=config.shuffle)
        # A routed request on its way to the engine (cost.per_request_s), by session: a
        # session has one request in flight at a time.
        self.in_transit: dict[int, SimRequest] = {}
        self.last_finish = 0.0

    def push(self, t: float, kind: int, a: int = 0, b: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, a, b))

    def run(self, on_progress: Callable[[float], None] | None) -> CellResult:
        config = self.config
        self.begin()
        counters_at_warmup: tuple[int, ...] | None = None
        last_progress = 0.0
        now = 0.0
        while self.events:
            now, _, kind, a, b = heapq.heappop(self.events)
            if now >= config.duration_s:
                now = config.duration_s
                break
            self.now = now
            if counters_at_warmup is None and now >= config.warmup_s:
                counters_at_warmup = _counters(self.engines)
            if on_progress is not None and now - last_progress >= 5.0:
                on_progress(now)
                last_progress = now
            if kind == _STEP_END:
                self.step_end(now, a, b)
            elif kind == _SEND:
                if a in self.sessions:
                    self.send(now, self.sessions[a])
            elif kind == _ENQUEUE:
                self.enqueue(now, self.in_transit.pop(a))
            elif kind == _SCRAPE:
                self.scrape(now)
            elif kind == _ARRIVE:
                self.arrive(now)
            elif kind == _RETRY:
                self.retry_held(now, a)
        if counters_at_warmup is None:  # the run ended within its warm-up
            counters_at_warmup = _counters(self.engines)
        self.measure(now, counters_at_warmup)
        if on_progress is not None:
            on_progress(config.duration_s)
        return self.result

    def begin(self) -> None:
        config = self.config
        if config.concurrency is not None:
            # Without think time the first sessions send their first requests at one
            # instant, in session order: Locust spawns its users in order and each sends its
            # first request within milliseconds of the previous one, and the gateway routes
            # them as they arrive (the request logs of 9 of 9 quick-profile cells show that
            # order). Which sessions share a replica follows from it.
            for _ in range(config.concurrency):
                self.start_session(0.0)
        else:
            assert config.arrival_rate is not None
            self.push(self.arrivals.expovariate(config.arrival_rate), _ARRIVE)
        self.push(0.0, _SCRAPE)

    def measure(self, now: float, counters_at_warmup: tuple[int, ...]) -> None:
        """The measured window's counters and length, once the loop has stopped at ``now``."""
        result, config = self.result, self.config
        end_counters = _counters(self.engines)
        result.prefix_queries = end_counters[0] - counters_at_warmup[0]
        result.prefix_hits = end_counters[1] - counters_at_warmup[1]
        result.preemptions = end_counters[2] - counters_at_warmup[2]
        if self.engines[0].tier is not None:
            result.offload = True
            result.external_queries = end_counters[3] - counters_at_warmup[3]
            result.external_hits = end_counters[4] - counters_at_warmup[4]
        result.sessions_started = self.started
        # A run with a session limit may end before its duration: measure until its last
        # reply, as a Locust run of fixed work is timed from its first request to its last.
        if config.sessions is not None and not self.sessions:
            now = self.last_finish
        result.window_s = max(now - config.warmup_s, 1e-9)

    def start_session(self, now: float) -> None:
        config = self.config
        if config.sessions is not None and self.started >= config.sessions:
            return
        rng = random.Random(config.seed * 1_000_003 + self.started)
        trajectory = self.order[self.started % len(self.order)]
        run = self.workload.runs[(trajectory, config.strategy)]
        s = _Session(self.started, config.seed, trajectory, rng, self.next_id)
        self.next_id += run.local_ids
        for e in self.engines:
            e.ensure(self.next_id)
        self.sessions[s.index] = s
        self.started += 1
        # Sessions do not start in lockstep: the first request after one think time.
        first = now + self.think_time.sample(rng)
        self.push(self.send_time(s, first), _SEND, s.index)

    def send_time(self, s: _Session, t: float) -> float:
        if self.config.send_times is None:
            return t
        return max(t, self.config.send_times[(s.index, s.step)])

    def send(self, now: float, s: _Session) -> None:
        config = self.config
        step = self.workload.runs[(s.trajectory, config.strategy)].steps[s.step]
        ids = np.concatenate([step.head, step.own + s.base]) if len(step.own) else step.head
        routed = self.routing.prepare(
            SIM_TENANT,
            s.key,
            prompt_tokens=step.prompt_tokens,
            last_prompt_tokens=s.last_prompt,
            prefix=step.prefix,
            now=now,
            block_chain=ids.tolist() if self.reads_chain else None,
            resident=self.resident(s) if config.kv_events else None,
        )
        req = SimRequest(
            s.index, -1, ids, step.prompt_tokens, step.output_tokens, arrival=now, sent=now
        )
        req.priority = routed.priority
        s.last_prompt = step.prompt_tokens
        s.last_ids = ids
        self.routed[s.index] = routed
        # First come, first served per replica is the admission's (its waiting queue).
        verdict = self.routing.admit(routed, now)
        if not verdict.admit:
            self.hold(now, routed, req, verdict.retry_at)
            return
        self.dispatch(now, routed, req)

    def resident(self, s: _Session) -> dict[str, int]:
        """Per replica holding any, the tokens of the session's last prompt it holds: what
        the KV events tell the gateway, here from the blocks themselves."""
        if s.last_ids is None:
            return {}
        bs = self.cost.block_size
        found = {}
        for replica, engine in zip(self.pool.replicas, self.engines, strict=True):
            blocks = engine.pool.hits(s.last_ids, len(s.last_ids))
            if blocks:
                found[replica.url] = blocks * bs
        return found

    def hold(self, now: float, routed: Routed, req: SimRequest, retry_at: float | None) -> None:
        """The admission seam holds the request at the gateway."""
        self.held[(routed.tenant, routed.session)] = (routed, req, None)
        self.set_retry(now, routed, req, retry_at)

    def set_retry(
        self, now: float, routed: Routed, req: SimRequest, retry_at: float | None
    ) -> None:
        """A held request's own timer (a gateway waiter's timeout): it asks again at
        ``retry_at``; a later verdict's time replaces an earlier one's."""
        key = (routed.tenant, routed.session)
        at = None if retry_at is None else _later(now, retry_at)
        if at is not None and at != self.held[key][2]:
            self.push(at, _RETRY, req.session)
        self.held[key] = (routed, req, at)

    def ask_held(self, now: float, key: tuple[str, str]) -> bool:
        """Ask again for a held request; admitted, it goes (True)."""
        routed, req, _ = self.held[key]
        verdict = self.routing.admit(routed, now)
        if not verdict.admit:
            self.set_retry(now, routed, req, verdict.retry_at)
            return False
        del self.held[key]
        self.dispatch(now, routed, req)
        return True

    def retry_held(self, now: float, session: int) -> None:
        """A held request's timer: it asks again (unless it went, or a later verdict moved
        its timer); admitted, the state changed for the others."""
        s = self.sessions.get(session)
        key = (SIM_TENANT, s.key) if s is not None else None
        if key is None or key not in self.held or self.held[key][2] != now:
            return
        if self.ask_held(now, key):
            self.admit_held(now)

    def admit_held(self, now: float) -> None:
        """The admission's state changed: ask again the held requests it names (those that
        may go now, in arrival order), as the gateway asks its waiters."""
        admission = self.routing.admission
        if admission is not None and self.held:
            admission.wake(lambda key: self.ask_held(now, key))

    def dispatch(self, now: float, routed: Routed, req: SimRequest) -> None:
        """An admitted request routed (by the policy, or as a measured run's log says) and
        on its way to its replica's engine."""
        config = self.config
        if config.routes is None:
            decision = self.routing.route(routed)
        else:
            step = self.sessions[req.session].step
            replica = self.pool.replicas[config.routes[(req.session, step)]]
            decision = self.routing.replayed(routed, replica)
        if decision.moved_from is not None and now >= config.warmup_s:
            self.result.moves += 1
        req.replica = self.index_of[decision.replica.url]
        if req.sent >= self.config.warmup_s:
            self.result.admission_wait_s.append(now - req.sent)
        if self.cost.per_request_s > 0:
            self.in_transit[req.session] = req
            self.push(now + self.cost.per_request_s, _ENQUEUE, req.session)
        else:
            self.enqueue(now, req)

    def enqueue(self, now: float, req: SimRequest) -> None:
        req.arrival = now
        engine = self.engines[req.replica]
        engine.add(req)
        if not engine.busy:
            end = engine.start_step(now)
            if end is not None:
                self.push(end, _STEP_END, engine.index, engine.version)
        else:
            moved = engine.interrupt(now)
            if moved is not None:
                self.push(moved, _STEP_END, engine.index, engine.version)

    def step_end(self, now: float, replica: int, version: int) -> None:
        engine = self.engines[replica]
        if version != engine.version or not engine.busy:
            return  # an end that moved: an arrival cut the decode jump short
        first, done = engine.finish_step(now)
        for req in first:
            self.routing.accepted(self.routed[req.session], now)
        for req in done:
            self.finished(now, req)
        end = engine.start_step(now)
        if end is not None:
            self.push(end, _STEP_END, replica, engine.version)

    def finished(self, now: float, req: SimRequest) -> None:
        config, result = self.config, self.result
        s = self.sessions[req.session]
        measured = None
        if req.first_token is not None and req.cached_tokens is not None:
            measured = (req.prompt_tokens - req.cached_tokens, req.first_token - req.sent)
        run = self.workload.runs[(s.trajectory, config.strategy)]
        pausing = not run.steps[s.step].ends_turn
        routed = self.routed.pop(req.session)
        self.routing.ended(routed, now, measured, pausing=pausing)
        self.last_finish = now
        if req.sent >= config.warmup_s:
            result.requests += 1
            assert req.first_scheduled is not None and req.first_token is not None
            result.queue_s.append(req.first_scheduled - req.arrival)
            result.ttft_s.append(req.first_token - req.sent)
            if config.log_requests:
                result.request_log.append(_record(req, s, routed, now))
        s.step += 1
        if s.step < len(run.steps):
            think = self.think_time.sample(s.rng, run.steps[s.step].think_s)
            self.push(self.send_time(s, now + think), _SEND, s.index)
        else:
            # The store's TTL would drop the assignment; the policy keeps counting the session
            # on its replica, as the gateway's does (nothing tells it a session ended).
            del self.sessions[s.index]
            self.assignments.forget(SIM_TENANT, s.key)
            if config.concurrency is not None and now < config.duration_s:
                self.start_session(now)
        self.admit_held(now)

    def scrape(self, now: float) -> None:
        """The gateway's scrape of every engine; measured from the warm-up on."""
        config, result = self.config, self.result
        usage = [e.pool.usage for e in self.engines]
        for r, e, u in zip(self.pool.replicas, self.engines, usage, strict=True):
            # vLLM counts the requests loading from the offload tier as waiting.
            r.metrics = ReplicaMetrics(
                running=len(e.running), waiting=len(e.waiting) + len(e.loading), kv_cache_usage=u
            )
        if now >= config.warmup_s:
            result.kv_time.append(now)
            result.kv_mean.append(sum(usage) / len(usage))
            result.kv_max.append(max(usage))
        exhausted = config.sessions is not None and self.started >= config.sessions
        if self.sessions or not exhausted:  # else the run is over: let the loop end
            self.push(now + config.scrape_interval_s, _SCRAPE)

    def arrive(self, now: float) -> None:
        """A Poisson arrival: a new session, and the next arrival drawn."""
        self.start_session(now)
        assert self.config.arrival_rate is not None
        self.push(now + self.arrivals.expovariate(self.config.arrival_rate), _ARRIVE)


def _record(req: SimRequest, s: _Session, routed: Routed, now: float) -> RequestRecord:
    """A finished request's record (it is the session's ``s.step``-th)."""
    assert req.first_scheduled is not None and req.first_token is not None
    decision = routed.decision
    return RequestRecord(
        session=s.index,
        step=s.step,
        trajectory=s.trajectory,
        replica=req.replica,
        reason=decision.reason if decision is not None else "",
        moved_from=decision.moved_from if decision is not None else None,
        sent=req.sent,
        arrival=req.arrival,
        first_scheduled=req.first_scheduled,
        first_token=req.first_token,
        finished=now,
        prompt_tokens=req.prompt_tokens,
        cached_tokens=req.cached_tokens or 0,
        output_tokens=req.output_tokens,
        preemptions=req.preemptions,
        priority=req.priority,
    )


def session_order(workload: Workload, seed: int, *, shuffle: bool = True) -> list[str]:
    """The trajectories sessions replay, in turn: every one equally often, in a seeded
    order or as loaded (session i replays ``order[i % len(order)]``, as a Locust user i
    does)."""
    order = list(workload.trajectories)
    if shuffle:
        random.Random(seed).shuffle(order)
    return order


def _later(now: float, retry_at: float) -> float:
    """When to ask again: ``retry_at``, but after ``now``. A deadline computed as
    ``now + max_wait - waited`` can round to ``now`` itself, and simulated time stands
    still between events: asking again at ``now`` would repeat forever."""
    return max(retry_at, math.nextafter(now, math.inf))


def _counters(engines: list[SimReplica]) -> tuple[int, ...]:
    return (
        sum(e.stats.prefix_queries for e in engines),
        sum(e.stats.prefix_hits for e in engines),
        sum(e.stats.preemptions for e in engines),
        sum(e.stats.external_queries for e in engines),
        sum(e.stats.external_hits for e in engines),
    )
