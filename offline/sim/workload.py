"""What simulated sessions send: every request of every trajectory, rendered by the real
strategy code and tokenized with the real tokenizer, once.

Sessions replay the same few trajectories many times over, so each (trajectory, step,
strategy) is rendered and tokenized once, here, and every session replaying it reuses the
result. A request is kept as the ids of its full prompt blocks (chained block hashes, as
``PrefixCache.block_hashes`` computes them, mapped to dense ids for ``BlockPool``):

- blocks wholly inside the prompt's *head* (the tools preamble and the leading system
  messages), and leading blocks that two different recordings have in common (the agent's
  template running on into the first user message), are named globally, so two sessions
  of the same agent share them on a replica, as vLLM's chained block hashes make two real
  sessions with one template and tenant share every block of their common prefix;
- the other blocks are named per trajectory and strategy, and offset per session instance,
  so two sessions replaying the same recording do not share their task-specific context
  (real sessions do different tasks). ``share="all"`` shares them instead (a load test
  that replays the same file from many users without a per-user salt does).

Each request also carries the shared-prefix hint the gateway computes from the same
rendered prompt (``router.session_route.shared_prefix``, for the simulator's one tenant
``SIM_TENANT``), so the simulated policy reads what the deployed one reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from gateway.config import GatewayConfig
from gateway.fold import make_renderer as registry_renderer
from gateway.fold.renderer import Renderer
from gateway.tokens import ChatTokenizer, SessionPrompts
from gateway.transcript import Transcript
from offline.prefix_cache import PrefixCache
from offline.replay import ReplayConfig, TrajectoryLike, requests_of
from router.session_route import SharedPrefix, shared_prefix
from router.turn_end import ends_turn

SHARE_MODES = ("head", "all")
# The tenant every simulated session belongs to.
SIM_TENANT = "sim"


@dataclass(frozen=True, slots=True)
class Step:
    """One request of a trajectory under one strategy."""

    head: np.ndarray  # global ids of the blocks inside the shared head
    own: np.ndarray  # run-local ids of the other full blocks
    prompt_tokens: int
    output_tokens: int
    head_tokens: int
    tokens: np.ndarray | None = None  # the prompt's token ids, when kept (calibration)
    prefix: SharedPrefix | None = None  # the gateway's shared-prefix hint for it
    ends_turn: bool = False  # its reply ends the agent's turn (router.turn_end)
    # The recorded seconds between the previous reply's end and this request (None: the
    # trajectory did not log it); the simulator uses it with ``SimConfig.think_cap_s``.
    think_s: float | None = None


@dataclass(frozen=True, slots=True)
class Run:
    """One trajectory under one strategy: its requests in order."""

    trajectory: str
    strategy: str
    steps: tuple[Step, ...]
    local_ids: int  # how many run-local ids its steps use


@dataclass(slots=True)
class Workload:
    runs: dict[tuple[str, str], Run]
    trajectories: tuple[str, ...]
    strategies: tuple[str, ...]
    shared_ids: int  # global ids used by heads
    block_size: int
    tokenizer: str
    share: str

    @property
    def requests_per_strategy(self) -> int:
        return sum(len(r.steps) for r in self.runs.values()) // max(1, len(self.strategies))


def _head_tokens(chat: ChatTokenizer, t: Transcript) -> int:
    n = len(chat.tools_ids(t))
    for m in t.messages:
        if m.role != "system":
            break
        n += len(chat.message_ids(m))
    return n


@dataclass(frozen=True, slots=True)
class _Reply:
    tokens: int  # what the model generated for its request
    ends_turn: bool
    think_s: float | None  # the recorded gap before its request


def _replies(chat: ChatTokenizer, trajectory: TrajectoryLike) -> list[_Reply]:
    """Each assistant reply, in order. The recordings keep no tool schemas: a harness
    whose replies call tools natively offered them (``router.turn_end``); a recorded reply
    is whole, so it stopped on its own."""
    history = trajectory.transcript
    replies = [m for m in history.messages if m.role == "assistant"]
    offered = bool(history.tools) or any(m.tool_calls for m in replies)
    return [
        _Reply(chat.message_count(m), ends_turn(offered, len(m.tool_calls), "stop"), think)
        for m, think in zip(replies, trajectory.think_times(), strict=True)
    ]


def build_workload(
    trajectories: Iterable[TrajectoryLike],
    chat: ChatTokenizer,
    config: ReplayConfig,
    *,
    share: str = "head",
    max_output_tokens: int = 4096,
    keep_tokens: bool = False,
    max_steps: int | None = None,
    fold: str = GatewayConfig.fold,
    make_renderer: Callable[..., Renderer] = registry_renderer,
    on_request: Callable[[], None] | None = None,
) -> Workload:
    """Render and tokenize every request of every trajectory under every strategy.

    ``keep_tokens`` keeps each prompt's token ids too (to send them to a real replica);
    ``max_output_tokens`` caps the recorded reply lengths the sessions generate;
    ``max_steps`` keeps each session's first requests only.

    Renderers are built as the gateway's pipeline builds them (``make_renderer(spec, k=,
    budget=)``, ReFold in fold mode ``fold``, the gateway's default unless given), so a
    simulated session is rendered as the gateway would render it. They render without KV
    pressure (``RenderState.pressure``): one rendering per (trajectory, step, strategy)
    serves every session, whatever the simulated replicas' load.
    """
    if share not in SHARE_MODES:
        raise ValueError(f"share must be one of {', '.join(SHARE_MODES)}, got {share!r}")
    bs = config.block_size
    shared: dict[int, int] = {}
    runs: dict[tuple[str, str], Run] = {}
    names: list[str] = []
    renderers = {
        spec: make_renderer(
            spec,
            k=config.k,
            budget=config.budget,
            fold=fold,
        )
        for spec in config.strategies
    }
    # Every request's block hashes first: a block is shared across sessions when it is in
    # the head or when another recording has the same hash (the same leading tokens).
    rendered_runs: list[tuple[str, str, list[_Rendered]]] = []
    first_seen: dict[int, str] = {}  # block hash -> the first recording that has it
    common: set[int] = set()  # hashes more than one recording has
    for trajectory in trajectories:
        names.append(trajectory.id)
        replies = _replies(chat, trajectory)
        seen_here: set[int] = set()  # this recording's hashes, every strategy
        for strategy, renderer in renderers.items():
            rendered = _render_run(
                trajectory, renderer, chat, replies, bs, max_steps, keep_tokens, on_request
            )
            for step in rendered:
                seen_here.update(step.hashes.tolist())
            rendered_runs.append((trajectory.id, strategy, rendered))
        for h in seen_here:
            if first_seen.setdefault(h, trajectory.id) != trajectory.id:
                common.add(h)
    for trajectory_id, strategy, rendered in rendered_runs:
        steps, local_ids = _name_blocks(rendered, shared, common, share, bs, max_output_tokens)
        runs[(trajectory_id, strategy)] = Run(trajectory_id, strategy, steps, local_ids)
    return Workload(
        runs=runs,
        trajectories=tuple(names),
        strategies=config.strategies,
        shared_ids=len(shared),
        block_size=bs,
        tokenizer=chat.counter.name,
        share=share,
    )


@dataclass(frozen=True, slots=True)
class _Rendered:
    """One request rendered and tokenized, before its blocks are named."""

    hashes: np.ndarray  # its full blocks' chained hashes
    prompt_tokens: int
    reply: _Reply
    head_tokens: int
    tokens: np.ndarray | None
    prefix: SharedPrefix | None


def _render_run(
    trajectory: TrajectoryLike,
    renderer: Renderer,
    chat: ChatTokenizer,
    replies: list[_Reply],
    block_size: int,
    max_steps: int | None,
    keep_tokens: bool,
    on_request: Callable[[], None] | None,
) -> list[_Rendered]:
    """One trajectory's requests under one renderer, as one session renders them."""
    hasher = PrefixCache(block_size=block_size)
    prompts = SessionPrompts(chat)
    cache = None
    rendered_steps = []
    requests = requests_of(trajectory.transcript, trajectory.compaction_indices)
    for n, (request, reply) in enumerate(zip(requests, replies, strict=True)):
        if max_steps is not None and n >= max_steps:
            break
        rendered = renderer.render(request, None, cache)
        cache = rendered.cache
        ids = prompts.prompt_ids(rendered.transcript)
        rendered_steps.append(
            _Rendered(
                hashes=np.asarray(hasher.block_hashes(ids), dtype=np.int64),
                prompt_tokens=len(ids),
                reply=reply,
                head_tokens=_head_tokens(chat, rendered.transcript),
                tokens=np.asarray(ids, dtype=np.int32) if keep_tokens else None,
                prefix=shared_prefix(SIM_TENANT, rendered.transcript),
            )
        )
        if on_request is not None:
            on_request()
    return rendered_steps


def _name_blocks(
    rendered: list[_Rendered],
    shared: dict[int, int],
    common: set[int],
    share: str,
    block_size: int,
    max_output_tokens: int,
) -> tuple[tuple[Step, ...], int]:
    """One run's steps with their blocks named: the head's (and leading blocks in
    ``common``) by global ids in ``shared``, the rest by run-local ids; and how many
    run-local ids it uses."""
    local: dict[int, int] = {}
    steps = []
    for r in rendered:
        hashes = r.hashes.tolist()
        if share == "all":
            n_head = len(hashes)
        else:
            n_head = min(len(hashes), r.head_tokens // block_size)
            while n_head < len(hashes) and hashes[n_head] in common:
                n_head += 1
        head = [shared.setdefault(h, len(shared)) for h in hashes[:n_head]]
        own = [local.setdefault(h, len(local)) for h in hashes[n_head:]]
        steps.append(
            Step(
                head=np.asarray(head, dtype=np.int64),
                own=np.asarray(own, dtype=np.int64),
                prompt_tokens=r.prompt_tokens,
                output_tokens=max(1, min(r.reply.tokens, max_output_tokens)),
                head_tokens=n_head * block_size,
                tokens=r.tokens,
                prefix=r.prefix,
                ends_turn=r.reply.ends_turn,
                think_s=r.reply.think_s,
            )
        )
    return tuple(steps), len(local)
