"""The discrete-event cluster: sessions replaying trajectories, the real routing policy,
R modelled vLLM replicas.

Agent sessions arrive at a fixed concurrency (a finished session is replaced at once) or
as a Poisson process. Each replays one trajectory step by step: it sends a request, waits
for the whole reply, "runs the tool" for an exponentially distributed think time, and sends
the next. Every request is routed by the policy ``router.make_policy`` builds, through the
same ``choose`` the gateway calls, against a ``ReplicaPool`` whose replicas carry what the
gateway would see: the last scrape of each engine (running, waiting, KV usage; every
``scrape_interval_s``) and the gateway's own in-flight count. Sticky policies keep their
assignments in an in-memory store with the same compare-and-set contract as the real ones.

Everything random comes from the seed: session s draws its trajectory and think times from
its own generator, so two cells (policies, strategies) with one seed replay the same
sessions with the same pauses and differ only in what the cell changes. Replica i draws
its step-time jitter (the cost model's ``step_jitter``) from a generator of its own, seeded
by the seed and i.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from gateway.config import GatewayConfig
from offline.sim.engine import SimReplica, SimRequest
from offline.sim.workload import Workload
from router import Decision, ReplicaMetrics, ReplicaPool, RouteHints, make_policy
from router.cost import CostModel
from router.policies import AssignedSessionPolicy

T = TypeVar("T")

_STEP_END, _SEND, _SCRAPE, _ARRIVE, _ENQUEUE = range(5)


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (the policy over an in-memory store)."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("a routing coroutine suspended; the simulator's store never does")


class MemoryAssignments:
    """The AssignmentStore contract in a dict, with no TTL: simulated sessions end
    explicitly and are forgotten then."""

    def __init__(self) -> None:
        self._map: dict[tuple[str, str], str] = {}

    async def get_assignment(self, tenant: str, session: str) -> str | None:
        return self._map.get((tenant, session))

    async def set_assignment(
        self, tenant: str, session: str, replica: str, *, expected: str | None, ttl_s: float
    ) -> str:
        current = self._map.get((tenant, session))
        if current is None or current == expected:
            self._map[(tenant, session)] = replica
            return replica
        return current

    def forget(self, tenant: str, session: str) -> None:
        self._map.pop((tenant, session), None)


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
        if self.think_s < 0 or self.scrape_interval_s <= 0:
            raise ValueError("think_s must be >= 0 and scrape_interval_s positive")
        if self.sessions is not None and self.sessions < 1:
            raise ValueError(f"sessions must be >= 1, got {self.sessions}")

    @property
    def load(self) -> str:
        if self.concurrency is not None:
            return f"{self.concurrency} concurrent"
        return f"{self.arrival_rate:g}/s Poisson"


@dataclass(slots=True)
class CellResult:
    """One (policy, strategy, load) cell, measured over [warmup, duration)."""

    policy: str
    strategy: str
    load: str
    window_s: float
    requests: int
    prefix_queries: int
    prefix_hits: int
    queue_s: list[float]
    ttft_s: list[float]
    preemptions: int
    moves: int
    sessions_started: int
    kv_time: list[float] = field(default_factory=list)
    kv_mean: list[float] = field(default_factory=list)
    kv_max: list[float] = field(default_factory=list)

    @property
    def hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    @property
    def steps_per_min(self) -> float:
        return self.requests / (self.window_s / 60)

    def summary(self) -> dict[str, Any]:
        def pct(xs: list[float], q: float) -> float:
            return float(np.percentile(xs, q)) if xs else 0.0

        def mean(xs: list[float]) -> float:
            return float(np.mean(xs)) if xs else 0.0

        return {
            "policy": self.policy,
            "strategy": self.strategy,
            "load": self.load,
            "requests": self.requests,
            "prefix_hit_rate": round(self.hit_rate, 4),
            "queue_mean_s": round(mean(self.queue_s), 4),
            "queue_p95_s": round(pct(self.queue_s, 95), 4),
            "ttft_mean_s": round(mean(self.ttft_s), 4),
            "ttft_p95_s": round(pct(self.ttft_s, 95), 4),
            "session_steps_per_min": round(self.steps_per_min, 1),
            "preemptions": self.preemptions,
            "moves": self.moves,
            "kv_usage_mean": round(mean(self.kv_mean), 4),
            "kv_usage_max": round(max(self.kv_max, default=0.0), 4),
        }


@dataclass(slots=True)
class _Session:
    index: int
    trajectory: str
    rng: random.Random
    base: int  # offset of its own block ids
    step: int = 0
    last_prompt: int | None = None


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
    urls = [f"http://sim-replica-{i}:8000" for i in range(config.replicas)]
    pool = ReplicaPool(urls)
    for r in pool.replicas:
        r.healthy = True
        r.metrics = ReplicaMetrics(running=0, waiting=0, kv_cache_usage=0.0)
    index_of = {u: i for i, u in enumerate(urls)}
    assignments = MemoryAssignments()
    policy = make_policy(
        config.policy,
        assignments=assignments,
        cost=cost,
        # The gateway's own default, so "sticky" is sticky as deployed today.
        rehome_margin=GatewayConfig.rehome_margin,
    )
    engines = [SimReplica.create(i, cost, config.seed) for i in range(config.replicas)]
    tenant = "sim"
    events: list[tuple[float, int, int, int, int]] = []
    seq = 0

    def push(t: float, kind: int, a: int = 0, b: int = 0) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, a, b))

    sessions: dict[int, _Session] = {}
    next_id = workload.shared_ids
    started = 0
    master = random.Random(config.seed)
    result = CellResult(
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

    order = session_order(workload, config.seed, shuffle=config.shuffle)

    def start_session(now: float) -> None:
        nonlocal next_id, started
        if config.sessions is not None and started >= config.sessions:
            return
        rng = random.Random(config.seed * 1_000_003 + started)
        trajectory = order[started % len(order)]
        run = workload.runs[(trajectory, config.strategy)]
        s = _Session(started, trajectory, rng, next_id)
        next_id += run.local_ids
        for e in engines:
            e.pool.ensure(next_id)
        sessions[s.index] = s
        started += 1
        # Sessions do not start in lockstep: the first request after one think time.
        first = now + rng.expovariate(1 / config.think_s) if config.think_s else now
        push(send_time(s, first), _SEND, s.index)

    def send_time(s: _Session, t: float) -> float:
        if config.send_times is None:
            return t
        return max(t, config.send_times[(s.index, s.step)])

    # A routed request on its way to the engine (cost.per_request_s), by session: a
    # session has one request in flight at a time.
    in_transit: dict[int, SimRequest] = {}
    last_finish = 0.0

    def enqueue(now: float, req: SimRequest) -> None:
        req.arrival = now
        engine = engines[req.replica]
        engine.add(req)
        if not engine.busy:
            end = engine.start_step(now)
            if end is not None:
                push(end, _STEP_END, engine.index, engine.version)
        else:
            moved = engine.interrupt(now)
            if moved is not None:
                push(moved, _STEP_END, engine.index, engine.version)

    def send(now: float, s: _Session) -> None:
        step = workload.runs[(s.trajectory, config.strategy)].steps[s.step]
        ids = np.concatenate([step.head, step.own + s.base]) if len(step.own) else step.head
        hints = RouteHints(
            prompt_tokens=step.prompt_tokens,
            cached_prefix_tokens=s.last_prompt,
            prefix_key=str(int(step.head[-1])) if len(step.head) else None,
            prefix_tokens=step.head_tokens,
        )
        if config.routes is None:
            decision = run_sync(policy.choose(tenant, str(s.index), pool, hints=hints))
        else:
            decision = Decision(pool.replicas[config.routes[(s.index, s.step)]], "replayed")
        if decision.moved_from is not None and now >= config.warmup_s:
            result.moves += 1
        decision.replica.in_flight += 1
        req = SimRequest(
            s.index,
            index_of[decision.replica.url],
            ids,
            step.prompt_tokens,
            step.output_tokens,
            arrival=now,
            sent=now,
        )
        s.last_prompt = step.prompt_tokens
        if cost.per_request_s > 0:
            in_transit[s.index] = req
            push(now + cost.per_request_s, _ENQUEUE, s.index)
        else:
            enqueue(now, req)

    def finished(now: float, req: SimRequest) -> None:
        nonlocal last_finish
        s = sessions[req.session]
        pool.replicas[req.replica].in_flight -= 1
        last_finish = now
        if req.sent >= config.warmup_s:
            result.requests += 1
            assert req.first_scheduled is not None and req.first_token is not None
            result.queue_s.append(req.first_scheduled - req.arrival)
            result.ttft_s.append(req.first_token - req.sent)
        s.step += 1
        run = workload.runs[(s.trajectory, config.strategy)]
        if s.step < len(run.steps):
            think = s.rng.expovariate(1 / config.think_s) if config.think_s else 0.0
            push(send_time(s, now + think), _SEND, s.index)
            return
        del sessions[s.index]
        assignments.forget(tenant, str(s.index))
        if isinstance(policy, AssignedSessionPolicy):
            policy.forget(tenant, str(s.index))
        if config.concurrency is not None and now < config.duration_s:
            start_session(now)

    if config.concurrency is not None:
        # Without think time the first sessions send their first requests at one instant,
        # in session order: Locust spawns its users in order and each sends its first
        # request within milliseconds of the previous one, and the gateway routes them as
        # they arrive (the request logs of 9 of 9 quick-profile cells show that order).
        # Which sessions share a replica follows from it.
        for _ in range(config.concurrency):
            start_session(0.0)
    else:
        assert config.arrival_rate is not None
        push(master.expovariate(config.arrival_rate), _ARRIVE)
    push(0.0, _SCRAPE)
    counters_at_warmup: tuple[int, int, int] | None = None
    last_progress = 0.0
    now = 0.0
    while events:
        now, _, kind, a, b = heapq.heappop(events)
        if now >= config.duration_s:
            now = config.duration_s
            break
        if counters_at_warmup is None and now >= config.warmup_s:
            counters_at_warmup = _counters(engines)
        if on_progress is not None and now - last_progress >= 5.0:
            on_progress(now)
            last_progress = now
        if kind == _STEP_END:
            engine = engines[a]
            if b != engine.version or not engine.busy:
                continue
            _, done = engine.finish_step(now)
            for req in done:
                finished(now, req)
            end = engine.start_step(now)
            if end is not None:
                push(end, _STEP_END, a, engine.version)
        elif kind == _SEND:
            if a in sessions:
                send(now, sessions[a])
        elif kind == _ENQUEUE:
            enqueue(now, in_transit.pop(a))
        elif kind == _SCRAPE:
            usage = [e.pool.usage for e in engines]
            for r, e, u in zip(pool.replicas, engines, usage, strict=True):
                r.metrics = ReplicaMetrics(
                    running=len(e.running), waiting=len(e.waiting), kv_cache_usage=u
                )
            if now >= config.warmup_s:
                result.kv_time.append(now)
                result.kv_mean.append(sum(usage) / len(usage))
                result.kv_max.append(max(usage))
            exhausted = config.sessions is not None and started >= config.sessions
            if sessions or not exhausted:  # else the run is over: let the loop end
                push(now + config.scrape_interval_s, _SCRAPE)
        elif kind == _ARRIVE:
            start_session(now)
            assert config.arrival_rate is not None
            push(now + master.expovariate(config.arrival_rate), _ARRIVE)
    if counters_at_warmup is None:
        counters_at_warmup = _counters(engines)
    end_counters = _counters(engines)
    result.prefix_queries = end_counters[0] - counters_at_warmup[0]
    result.prefix_hits = end_counters[1] - counters_at_warmup[1]
    result.preemptions = end_counters[2] - counters_at_warmup[2]
    result.sessions_started = started
    # A run with a session limit may end before its duration: measure until its last
    # reply, as a Locust run of fixed work is timed from its first request to its last.
    if config.sessions is not None and not sessions:
        now = last_finish
    result.window_s = max(now - config.warmup_s, 1e-9)
    if on_progress is not None:
        on_progress(config.duration_s)
    return result


def session_order(workload: Workload, seed: int, *, shuffle: bool = True) -> list[str]:
    """The trajectories sessions replay, in turn: every one equally often, in a seeded
    order or as loaded (session i replays ``order[i % len(order)]``, as a Locust user i
    does)."""
    order = list(workload.trajectories)
    if shuffle:
        random.Random(seed).shuffle(order)
    return order


def _counters(engines: list[SimReplica]) -> tuple[int, int, int]:
    return (
        sum(e.stats.prefix_queries for e in engines),
        sum(e.stats.prefix_hits for e in engines),
        sum(e.stats.preemptions for e in engines),
    )
