"""What simulated sessions send: every request of every trajectory, rendered by the real
strategy code and tokenized with the real tokenizer, once.

Sessions replay the same few trajectories many times over, so each (trajectory, step,
strategy) is rendered and tokenized once, here, and every session replaying it reuses the
result. A request is kept as the ids of its full prompt blocks (chained block hashes, as
``PrefixCache.block_hashes`` computes them, mapped to dense ids for ``BlockPool``):

- blocks wholly inside the prompt's *head* (the tools preamble and the leading system
  messages) are named globally, so two sessions of the same agent share them on a replica,
  as two real sessions with one system prompt and tenant do;
- the other blocks are named per trajectory and strategy, and offset per session instance,
  so two sessions replaying the same recording do not share their task-specific context
  (real sessions do different tasks). ``share="all"`` shares them instead (a load test
  that replays the same file from many users without a per-user salt does).
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

SHARE_MODES = ("head", "all")


@dataclass(frozen=True, slots=True)
class Step:
    """One request of a trajectory under one strategy."""

    head: np.ndarray  # global ids of the blocks inside the shared head
    own: np.ndarray  # run-local ids of the other full blocks
    prompt_tokens: int
    output_tokens: int
    head_tokens: int
    tokens: np.ndarray | None = None  # the prompt's token ids, when kept (calibration)


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


def _reply_tokens(chat: ChatTokenizer, history: Transcript) -> list[int]:
    """Tokens of each assistant reply, in order: what the model generated for each request."""
    return [chat.message_count(m) for m in history.messages if m.role == "assistant"]


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
            **({"fold": fold} if "refold" in spec.split("+") else {}),
        )
        for spec in config.strategies
    }
    for trajectory in trajectories:
        names.append(trajectory.id)
        replies = _reply_tokens(chat, trajectory.transcript)
        for strategy, renderer in renderers.items():
            local: dict[int, int] = {}
            hasher = PrefixCache(block_size=bs)
            prompts = SessionPrompts(chat)
            cache = None
            steps = []
            requests = requests_of(trajectory.transcript, trajectory.compaction_indices)
            for n, (request, reply) in enumerate(zip(requests, replies, strict=True)):
                if max_steps is not None and n >= max_steps:
                    break
                rendered = renderer.render(request, None, cache)
                cache = rendered.cache
                ids = prompts.prompt_ids(rendered.transcript)
                hashes = hasher.block_hashes(ids)
                head_tokens = _head_tokens(chat, rendered.transcript)
                n_head = len(hashes) if share == "all" else min(len(hashes), head_tokens // bs)
                head = [shared.setdefault(h, len(shared)) for h in hashes[:n_head]]
                own = [local.setdefault(h, len(local)) for h in hashes[n_head:]]
                steps.append(
                    Step(
                        head=np.asarray(head, dtype=np.int64),
                        own=np.asarray(own, dtype=np.int64),
                        prompt_tokens=len(ids),
                        output_tokens=max(1, min(reply, max_output_tokens)),
                        head_tokens=n_head * bs,
                        tokens=np.asarray(ids, dtype=np.int32) if keep_tokens else None,
                    )
                )
                if on_request is not None:
                    on_request()
            runs[(trajectory.id, strategy)] = Run(trajectory.id, strategy, tuple(steps), len(local))
    return Workload(
        runs=runs,
        trajectories=tuple(names),
        strategies=config.strategies,
        shared_ids=len(shared),
        block_size=bs,
        tokenizer=chat.counter.name,
        share=share,
    )
