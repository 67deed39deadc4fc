"""One replica as vLLM v1 schedules it, stepped by the cluster's event loop.

Modelled on ``vllm/v1/core/sched/scheduler.py`` (``Scheduler.schedule``) and
``vllm/v1/core/kv_cache_manager.py`` / ``block_pool.py``:

- Each step has a token budget (``max_num_batched_tokens``). RUNNING requests are served
  first, in order: a prefill (new, resumed or partly done) gets as many of its remaining
  tokens as the budget allows (chunked prefill), a decoding request one token.
- A running request whose new blocks do not fit preempts the *last* running request
  (FCFS), by recompute: its blocks are freed (they stay cached until evicted), it goes back
  to the front of WAITING with nothing computed, and is re-prefilled later, usually from
  its own cached blocks. If it is itself the last, it preempts itself.
- Under ``--scheduling-policy priority`` (``priority``) WAITING is ordered by (priority,
  arrival) (``PriorityRequestQueue``: lower value first), a preempted request goes back
  into it in that order, and the victim is the running request of the highest (priority,
  arrival), wherever it is in the batch: if it was already scheduled this step, its tokens
  go back to the budget (``Scheduler.schedule``).
- WAITING requests are admitted only in steps that preempted nothing, in order, while the
  budget lasts and fewer than ``max_num_seqs`` run. Admission looks up the longest cached
  prefix of full blocks (at most all tokens but the last), counts a prefix-cache query and
  hit as vLLM's ``prefix_cache_queries``/``hits`` counters do (a preempted request's
  second lookup is not counted there, as in vLLM), and stops at the first
  request whose blocks do not fit (head of line): all of its blocks, not just the first
  chunk's, as vLLM checks by default (``scheduler_reserve_full_isl``).
- The step's duration comes from the cost model (with the streaming of every token it
  emits, where the serving path shares the engine's cores), times the replica's speed
  factor: with the cost model's ``step_jitter`` a lognormal draw (mean 1) from the
  replica's own seeded generator, made whenever the batch changes (a request admitted,
  finished or preempted) and kept while it stays, as a shared core's speed follows what
  else is running. A prefill that completes
  samples the first token in the same step; every decode step adds one token; a request
  ends after its output.

Between arrivals a replica with only decoding requests and nothing waiting runs many
identical steps; they are taken as one jump, cut short when a request arrives (it waits at
most for the step in progress, as in the engine).
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from offline.prefix_cache import BlockPool
from router.cost import CostModel

_NO_IDS = np.zeros(0, dtype=np.int64)


@dataclass(slots=True, eq=False)
class SimRequest:
    session: int
    replica: int
    ids: np.ndarray  # ids of the full prompt blocks
    prompt_tokens: int
    output_tokens: int
    arrival: float  # at the engine's waiting queue
    sent: float = 0.0  # by the client (arrival less the serving path's per-request latency)
    computed: int = 0
    output_done: int = 0
    held: int = 0  # ids[:held] are referenced
    anonymous: int = 0
    first_scheduled: float | None = None
    first_token: float | None = None
    finished: float | None = None
    cached_tokens: int | None = None  # prefix hit at first admission
    preemptions: int = 0
    priority: int = 0  # vLLM's request priority (read under priority scheduling)

    @property
    def rank(self) -> tuple[int, float, int]:
        """vLLM's ``Request.__lt__``: priority, then arrival, then id."""
        return (self.priority, self.arrival, self.session)

    @property
    def num_tokens(self) -> int:
        return self.prompt_tokens + self.output_done


@dataclass(slots=True)
class ReplicaStats:
    prefix_queries: int = 0
    prefix_hits: int = 0
    preemptions: int = 0
    steps: int = 0
    busy_s: float = 0.0


@dataclass(slots=True)
class _Pending:
    """The step in progress: what it computes, when it started, how many steps it stands for."""

    scheduled: list[tuple[SimRequest, int]]
    start: float
    step_s: float
    repeat: int = 1


@dataclass(slots=True)
class SimReplica:
    index: int
    cost: CostModel
    pool: BlockPool
    waiting: deque[SimRequest] = field(default_factory=deque)
    running: list[SimRequest] = field(default_factory=list)
    stats: ReplicaStats = field(default_factory=ReplicaStats)
    pending: _Pending | None = None
    version: int = 0  # bumps when the pending step's end moves
    rng: random.Random = field(default_factory=random.Random)
    speed: float = 1.0  # step-time factor of the current batch (cost.step_jitter)
    batch_changed: bool = True
    priority: bool = False  # vLLM's --scheduling-policy priority, else fcfs

    @classmethod
    def create(
        cls, index: int, cost: CostModel, seed: int = 0, *, priority: bool = False
    ) -> SimReplica:
        rng = random.Random(seed * 1_000_003 + 7_919 * (index + 1))
        # vLLM's BlockPool takes one block out as the null block (padding for skipped
        # positions): requests and the prefix cache share the others.
        pool = BlockPool(cost.kv_pool_blocks - 1)
        return cls(index, cost, pool, rng=rng, priority=priority)

    def _step_factor(self) -> float:
        """The speed factor for the step being planned: redrawn when the batch changed."""
        sigma = self.cost.step_jitter
        if sigma > 0 and self.batch_changed:
            self.speed = math.exp(self.rng.gauss(-sigma * sigma / 2, sigma))
        self.batch_changed = False
        return self.speed

    @property
    def busy(self) -> bool:
        return self.pending is not None

    def add(self, request: SimRequest) -> None:
        if self.priority:
            self._queue(request)
        else:
            self.waiting.append(request)

    def _queue(self, request: SimRequest) -> None:
        """Into WAITING in (priority, arrival) order."""
        rank = request.rank
        at = len(self.waiting)
        while at > 0 and self.waiting[at - 1].rank > rank:
            at -= 1
        self.waiting.insert(at, request)

    def interrupt(self, now: float) -> float | None:
        """A request arrived: cut a decode jump at the step in progress. Returns the new end
        time when it moved, else None."""
        p = self.pending
        if p is None or p.repeat == 1:
            return None
        done = min(p.repeat, max(1, math.ceil((now - p.start) / p.step_s - 1e-9)))
        if done == p.repeat:
            return None
        p.repeat = done
        self.version += 1
        return p.start + done * p.step_s

    # --- one step -------------------------------------------------------------------

    def start_step(self, now: float) -> float | None:
        """Schedule the next step; returns its end time, or None when there is no work."""
        jump = self._decode_jump(now)
        if jump is not None:
            return jump
        bs = self.cost.block_size
        budget = self.cost.max_num_batched_tokens
        scheduled: list[tuple[SimRequest, int]] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens - req.computed, budget)
            itself = False
            # Most steps of a decoding request need no new block: skip the allocator then.
            fits = -(-(req.computed + n) // bs) <= req.held + req.anonymous
            while not fits and not self._allocate(req, req.computed + n, bs):
                if self.priority:
                    victim = max(self.running, key=lambda r: r.rank)
                    at = self.running.index(victim)
                    del self.running[at]
                    if at < i:  # scheduled already: its tokens go back to the budget
                        i -= 1
                        k = next(k for k, (r, _) in enumerate(scheduled) if r is victim)
                        budget += scheduled.pop(k)[1]
                else:
                    victim = self.running.pop()  # the last one: FCFS
                self._preempt(victim)
                preempted = True
                if victim is req:
                    itself = True
                    break
            if itself:
                break
            scheduled.append((req, n))
            budget -= n
            i += 1
        if not preempted:
            while self.waiting and budget > 0 and len(self.running) < self.cost.max_num_seqs:
                req = self.waiting[0]
                hit = 0
                if req.computed == 0:
                    limit = min(len(req.ids), (req.num_tokens - 1) // bs)
                    hit = self.pool.hits(req.ids, limit) * bs
                n = min(req.num_tokens - req.computed - hit, budget)
                if not self._whole_fits(req, hit // bs, bs):
                    break
                if not self._allocate(req, req.computed + hit + n, bs):
                    break
                if req.computed == 0:
                    # vLLM counts a preempted request's lookup apart (PrefixCacheStats.
                    # record(preempted=...) in v1/metrics/stats.py, preempted_queries/
                    # hits), not in vllm:prefix_cache_queries/hits.
                    if req.preemptions == 0:
                        self.stats.prefix_queries += req.num_tokens
                        self.stats.prefix_hits += hit
                        req.cached_tokens = hit
                    req.computed = hit
                self.waiting.popleft()
                self.running.append(req)
                self.batch_changed = True
                scheduled.append((req, n))
                budget -= n
        if not scheduled:
            return None
        # One pass over the batch (the simulator's hottest loop): decodes, tokens computed,
        # tokens attended, and tokens emitted (decodes and prefills that complete).
        decode = tokens = attended = emitted = 0
        for r, n in scheduled:
            if n == 1 and r.output_done > 0:
                decode += 1
            tokens += n
            after = r.computed + n
            attended += after
            if after >= r.prompt_tokens + r.output_done:
                emitted += 1
            if r.first_scheduled is None:
                r.first_scheduled = now
        step_s = self.cost.step_s(tokens - decode, decode, attended, emitted) * self._step_factor()
        self.pending = _Pending(scheduled, now, step_s)
        self.version += 1
        return now + step_s

    def _decode_jump(self, now: float) -> float | None:
        """Many decode-only steps at once, when nothing waits and every running request
        decodes: until the first of them finishes."""
        running = self.running
        if self.waiting or not running:
            return None
        repeat = running[0].output_tokens
        for r in running:
            if r.prompt_tokens + r.output_done - r.computed != 1:
                return None
            repeat = min(repeat, r.output_tokens - r.output_done)
        if repeat < 2:
            return None
        bs = self.cost.block_size
        extra = computed = 0
        for r in running:
            computed += r.computed
            extra += -(-(r.computed + repeat) // bs) - -(-(r.computed + 1) // bs)
            fits = -(-(r.computed + 1) // bs) <= r.held + r.anonymous
            if not fits and not self._allocate(r, r.computed + 1, bs):
                return None
        if extra > self.pool.free:
            return None
        n = len(running)
        attended = computed + n * (repeat + 1) // 2
        step_s = self.cost.step_s(0, n, attended) * self._step_factor()
        self.pending = _Pending([(r, 1) for r in self.running], now, step_s, repeat)
        self.version += 1
        return now + repeat * step_s

    def finish_step(self, now: float) -> tuple[list[SimRequest], list[SimRequest]]:
        """Apply the step in progress; returns (requests that got their first token,
        requests that finished)."""
        p = self.pending
        assert p is not None
        self.pending = None
        self.stats.steps += p.repeat
        self.stats.busy_s += p.repeat * p.step_s
        bs = self.cost.block_size
        first: list[SimRequest] = []
        done: list[SimRequest] = []
        # Preemption happens only while a step is planned, and takes the last running
        # requests, never one already scheduled: every scheduled request is still running.
        repeat = p.repeat
        for req, n in p.scheduled:
            computed = req.computed = req.computed + n * repeat
            if computed >= req.prompt_tokens + req.output_done:
                req.output_done += repeat
                if req.first_token is None:
                    req.first_token = now
                    first.append(req)
                if req.output_done >= req.output_tokens:
                    req.finished = now
                    done.append(req)
            if repeat > 1 and -(-computed // bs) > req.held + req.anonymous:
                # The jump checked these blocks fit; nothing else allocated since.
                self._allocate(req, req.computed, bs)
        for req in done:
            self.running.remove(req)
            self._free(req)
        self.batch_changed |= bool(done)
        return first, done

    # --- blocks ---------------------------------------------------------------------

    def _whole_fits(self, req: SimRequest, hit_blocks: int, bs: int) -> bool:
        """vLLM admits a waiting request only when its whole sequence fits, not just the
        first chunk (``scheduler_reserve_full_isl``, on by default in 0.32.0; kv_cache_
        manager.py ``allocate_slots``): free blocks must cover every block past its
        prefix hit, plus the hit blocks now sitting unreferenced in the free queue, which
        it takes out of there."""
        need = -(-req.num_tokens // bs) - req.held - req.anonymous - hit_blocks
        if hit_blocks:
            need += int((self.pool.refs[req.ids[:hit_blocks]] == 0).sum())
        return need <= self.pool.free

    def _allocate(self, req: SimRequest, tokens: int, bs: int) -> bool:
        """Hold the blocks ``tokens`` of ``req`` need (full prompt blocks by their ids)."""
        hashed = min(len(req.ids), tokens // bs)
        anonymous = math.ceil(tokens / bs) - hashed
        if hashed <= req.held and anonymous <= req.anonymous:
            return True
        if hashed > req.held:
            if not self.pool.acquire(req.ids[req.held : hashed], anonymous - req.anonymous):
                return False
            req.held = hashed
        elif not self.pool.acquire(_NO_IDS, anonymous - req.anonymous):
            return False
        req.anonymous = anonymous
        return True

    def _free(self, req: SimRequest) -> None:
        self.pool.release(req.ids[: req.held], req.anonymous)
        req.held = 0
        req.anonymous = 0

    def _preempt(self, req: SimRequest) -> None:
        self.batch_changed = True
        self._free(req)
        req.computed = 0
        req.preemptions += 1
        self.stats.preemptions += 1
        if self.priority:
            self._queue(req)
        else:
            self.waiting.appendleft(req)
