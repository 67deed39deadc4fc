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

With a CPU KV offload tier (``cost.offload_tokens``: vLLM's ``--kv-offloading-size``, which
runs the ``OffloadingConnector`` of ``distributed/kv_transfer/kv_connector/v1/
offloading_connector.py`` and ``offloading/scheduler.py``; the tier's capacity and LRU in
``offline.sim.offload``):

- Stores are write-through, as blocks are computed: after every step each scheduled request
  offers the tier the full prompt blocks it has computed and not offered before, from block
  0, so its GPU hit too (``_build_store_jobs`` from ``next_stored_chunk_idx``; only the
  prompt, ``offload_prompt_only`` being on by default). Nothing is stored on eviction from
  the GPU or on finish: a prefix the GPU pool evicts is in the tier if the tier kept it.
- A first admission (new or preempted) asks the tier, past its GPU hit, for the run of
  blocks it holds (``get_num_new_matched_tokens``, ``_maximal_prefix_lookup``). With a hit
  it is admitted to load (``load_kv_async``): its whole sequence must fit, as for any
  admission, and the loaded blocks beside what admitted prefills still need
  (``_inflight_prefill_reserved_blocks``); its blocks are allocated, it takes no token
  budget, waits apart (``WAITING_FOR_REMOTE_KVS``), and the next waiting request is
  considered. The load takes ``cost.reload_s`` (its KV bytes over ``offload_bytes_per_s``),
  from the step it was admitted in and after the loads issued before it (the worker's
  CPU->GPU transfers run in submission order, ``v1/kv_offload/cpu/gpu_worker.py``); the
  request is runnable at the first step that starts after its load ends (a worker reports
  finished transfers after a step), and runnable loaded requests are admitted before the
  waiting ones (``kv_holding_waiting``), to compute the rest of their prompt. A replica
  with nothing else to run idles until its first load ends; an arrival ends the idle at
  once (vLLM's engine steps empty meanwhile). Blocks a load reads cannot be evicted from
  the tier until the loaded request is admitted.
- Counters as vLLM keeps them: ``vllm:prefix_cache_queries``/``hits`` count the GPU hit only
  (``record_prefix_cache_stats`` with the local hit); the connector's
  ``external_prefix_cache_queries``/``hits`` the tokens past it and those loaded; the
  reply's cached tokens (``PrefillStats.num_cached_tokens``) both.

Simplified: a store is complete when the step that computed its blocks ends (vLLM copies
them during the next step; the GPU->CPU traffic, ~0.6 GB/s at the H200 preset's prefill
rate, is not charged to the link); a loading request's blocks are found by other lookups
from its admission on (vLLM caches them when the load ends; blocks being prefilled are
found early here too); a prompt whose blocks all hit recomputes its last block, as with
the GPU cache (vLLM loads it and recomputes one token); the tier evicts in the block pool's
batches; no load fails; the state of a hybrid model's linear-attention layers is in
neither the GPU pool nor the tier (the presets count the full-attention KV only).
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from offline.prefix_cache import BlockPool
from offline.sim.offload import OffloadTier
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
    # With a CPU offload tier: ids[:offloaded] were offered to it (the connector's
    # next_stored_chunk_idx), ids[observed:offloaded] get its recency when the request
    # ends; while its hit loads from the tier, it is runnable from ready_at on.
    offloaded: int = 0
    observed: int = 0
    ready_at: float = 0.0

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
    # vLLM's connector counters (vllm:external_prefix_cache_queries/hits): what first
    # admissions asked of the offload tier past their GPU hit, and what it held.
    external_queries: int = 0
    external_hits: int = 0
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
    # The CPU offload tier (cost.offload_tokens), and the requests loading their hit from
    # it (vLLM's WAITING_FOR_REMOTE_KVS), in the order they were admitted.
    tier: OffloadTier | None = None
    loading: list[SimRequest] = field(default_factory=list)
    loads_end: float = 0.0  # when the loads issued so far are done: they run one at a time

    @classmethod
    def create(
        cls, index: int, cost: CostModel, seed: int = 0, *, priority: bool = False
    ) -> SimReplica:
        rng = random.Random(seed * 1_000_003 + 7_919 * (index + 1))
        # vLLM's BlockPool takes one block out as the null block (padding for skipped
        # positions): requests and the prefix cache share the others.
        pool = BlockPool(cost.kv_pool_blocks - 1)
        tier = None
        if cost.offload_tokens >= cost.block_size and cost.offload_bytes_per_s > 0:
            tier = OffloadTier(cost.offload_tokens // cost.block_size)
        return cls(index, cost, pool, rng=rng, priority=priority, tier=tier)

    def ensure(self, n_ids: int) -> None:
        """Grow the block id space (of the pool and the tier) to at least ``n_ids``."""
        self.pool.ensure(n_ids)
        if self.tier is not None:
            self.tier.ensure(n_ids)

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
        """A request arrived: cut a decode jump at the step in progress, or an idle wait for
        a load. Returns the new end time when it moved, else None."""
        p = self.pending
        if p is not None and not p.scheduled:
            # Idle until a load completes: the engine's empty steps would take it at once.
            p.step_s = now - p.start
            self.version += 1
            return now
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
            while budget > 0 and len(self.running) < self.cost.max_num_seqs:
                # Requests whose load completed go first (vLLM's kv_holding_waiting).
                loaded = self._loaded(now) if self.loading else None
                if loaded is None and not self.waiting:
                    break
                req = self.waiting[0] if loaded is None else loaded
                hit = 0
                if req.computed == 0:
                    limit = min(len(req.ids), (req.num_tokens - 1) // bs)
                    hit = self.pool.hits(req.ids, limit) * bs
                    if self.tier is not None:
                        held = self.tier.hits(req.ids[hit // bs : limit])
                        if held:
                            if not self._start_load(req, hit // bs, held, now, bs):
                                break
                            continue
                n = min(req.num_tokens - req.computed - hit, budget)
                if not self._whole_fits(req, hit // bs, bs):
                    break
                if not self._allocate(req, req.computed + hit + n, bs):
                    break
                if req.computed == 0:
                    self._count_lookup(req, hit, 0)
                    req.computed = hit
                if loaded is None:
                    self.waiting.popleft()
                else:
                    self.loading.remove(req)
                    assert self.tier is not None
                    self.tier.unpin(req.ids[req.observed : req.computed // bs])
                self.running.append(req)
                self.batch_changed = True
                scheduled.append((req, n))
                budget -= n
        if not scheduled:
            if not self.loading:
                return None
            # Nothing to run until a load completes (vLLM's engine steps empty meanwhile).
            wake = min(r.ready_at for r in self.loading)
            if wake <= now:
                return None  # a completed load that does not fit: a finishing request frees
            self.pending = _Pending([], now, wake - now)
            self.version += 1
            return wake
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
        if self.waiting or self.loading or not running:
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
        if p.scheduled:
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
            if self.tier is not None and req.offloaded < len(req.ids):
                self._offload(req, self.tier, bs)
        for req in done:
            self.running.remove(req)
            self._free(req)
            if self.tier is not None:
                self.tier.touch(req.ids[req.observed : req.offloaded])
        self.batch_changed |= bool(done)
        return first, done

    # --- the CPU offload tier ----------------------------------------------------------

    def _count_lookup(self, req: SimRequest, hit: int, loaded: int) -> None:
        """A first admission's lookup in the counters. vLLM counts a preempted request's
        lookup apart (PrefixCacheStats.record(preempted=...) in v1/metrics/stats.py,
        preempted_queries/hits), not in vllm:prefix_cache_queries/hits nor the
        connector's; the reply's cached tokens are the GPU hit and the load together."""
        if req.preemptions:
            return
        self.stats.prefix_queries += req.num_tokens
        self.stats.prefix_hits += hit
        if self.tier is not None:
            self.stats.external_queries += req.num_tokens - hit
            self.stats.external_hits += loaded
        req.cached_tokens = hit + loaded

    def _loaded(self, now: float) -> SimRequest | None:
        """The next request whose load has completed by ``now``: the first, or under
        priority scheduling the first by (priority, arrival)."""
        ready = [r for r in self.loading if r.ready_at <= now]
        if not ready:
            return None
        return min(ready, key=lambda r: r.rank) if self.priority else ready[0]

    def _start_load(self, req: SimRequest, hit: int, held: int, now: float, bs: int) -> bool:
        """Admit the waiting ``req`` to load the ``held`` blocks after its GPU hit of
        ``hit`` blocks from the tier, as vLLM's scheduler does with an async connector
        load: its blocks are allocated, it computes nothing this step and takes no budget,
        and waits apart until the load completes while the next waiting request is
        considered. False when its blocks do not fit (it stays at the head)."""
        if not self._whole_fits(req, hit, bs):
            return False
        # The load's blocks must also leave room for what admitted prefills still need
        # (Scheduler._inflight_prefill_reserved_blocks).
        reserved = sum(
            -(-r.num_tokens // bs) - r.held - r.anonymous
            for r in (*self.running, *self.loading)
            if r.computed < r.num_tokens - 1
        )
        need = held + int((self.pool.refs[req.ids[:hit]] == 0).sum())
        if need > self.pool.free - reserved:
            return False
        if not self._allocate(req, (hit + held) * bs, bs):
            return False
        assert self.tier is not None
        self._count_lookup(req, hit * bs, held * bs)
        req.computed = (hit + held) * bs
        # The connector stores none of the hit again (OffloadPolicy.CHUNK_LEVEL).
        req.observed, req.offloaded = hit, max(req.offloaded, hit + held)
        self.tier.pin(req.ids[hit : hit + held])
        # The load starts with this step, after the loads before it (the worker's
        # CPU->GPU transfers run in submission order), and is seen complete at the first
        # step that starts after it ends.
        self.loads_end = max(now, self.loads_end) + self.cost.reload_s(held * bs)
        req.ready_at = self.loads_end
        self.waiting.popleft()
        self.loading.append(req)
        return True

    def _offload(self, req: SimRequest, tier: OffloadTier, bs: int) -> None:
        """Offer the prompt blocks ``req`` has computed so far to the tier, as the
        connector does after every step (the prompt only: ``offload_prompt_only``)."""
        computed = min(len(req.ids), req.computed // bs)
        if computed > req.offloaded and tier.store(req.ids[req.offloaded : computed]):
            req.offloaded = computed

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
