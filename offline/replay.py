"""Replay recorded agent sessions through the context strategies, offline.

Each trajectory is replayed as its harness sent it: request t holds every message before
the t-th assistant reply. Every request is rendered by every strategy (one renderer cache
per session and strategy, passed back each call), tokenized as a ChatML prompt, and fed to
a prefix-cache simulator (one per session and strategy, as if each session had its own
sticky replica). The result holds per-request series and per-strategy totals.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from gateway.fold.operators import registered
from gateway.fold.renderer import Renderer, TokenCount
from gateway.fold.spec import parse_spec
from gateway.tokens import GENERATION_PROMPT, ChatTokenizer, SessionPrompts
from gateway.transcript import Message, Transcript
from offline.prefix_cache import PrefixCache

# Qwen3.6-27B KV cache bytes per token. Its 64 layers are 16 x (3 Gated DeltaNet + 1 gated
# full-attention); only the 16 full-attention layers keep a per-token KV cache (DeltaNet
# keeps a fixed-size recurrent state per sequence). Full attention: 4 KV heads, head_dim
# 256. So 16 layers x 4 heads x 256 x 2 (K and V) x 2 bytes (bf16) = 65,536 bytes/token.
# Source: the Qwen3.6-27B model card ("Hidden Layout: 16 x (3 x (Gated DeltaNet -> FFN) ->
# 1 x (Gated Attention -> FFN))", "Attention Heads: 24 for Q and 4 for KV, Head Dimension:
# 256"), as mirrored at https://shilu.ai/articles/qwen-hf/qwen-qwen3.6-27b-fp8 and
# https://ai.gitcode.com/openharmony-models/Qwen3.6-27B-GGUF; config.json layer_types
# (48 linear_attention + 16 full_attention) per http://eadst.com/blog/325.
MODEL_KV_BYTES_PER_TOKEN: dict[str, int] = {"qwen3.6-27b": 16 * 4 * 256 * 2 * 2}

GIB = 1024**3
FOLD_MODES = ("recorded", "auto", "on", "off")
_FOLD_LINES = re.compile(r"^\s*PROGRESS:.*\n\s*STALE:", re.MULTILINE)


class TrajectoryLike(Protocol):
    """What the replay reads from ``offline.importers.Trajectory``."""

    id: str
    harness: str
    transcript: Transcript
    compaction_indices: tuple[int, ...]

    def think_times(self) -> list[float | None]:
        """Per assistant reply, the recorded gap before its request (None: not logged)."""
        ...


RendererFactory = Callable[..., Renderer]


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    strategies: tuple[str, ...]
    k: int = 3
    budget: int | None = None
    block_size: int = 16
    cache_blocks: int | None = None
    kv_bytes_per_token: int = MODEL_KV_BYTES_PER_TOKEN["qwen3.6-27b"]
    # ReFold's fold mode. "recorded": "on" for sessions whose replies carry PROGRESS/STALE
    # lines, else "off" — a recorded reply cannot answer an ask, so asking it measures
    # nothing but the ask. "auto", "on", "off": ReFold's own modes, for every session
    # ("auto" is the gateway's default: it shows what its asks cost on these runs).
    fold: str = "recorded"

    def __post_init__(self) -> None:
        if self.fold not in FOLD_MODES:
            raise ValueError(f"fold must be one of {', '.join(FOLD_MODES)}, got {self.fold!r}")
        if not self.strategies:
            raise ValueError("at least one strategy is needed")
        if len(set(self.strategies)) != len(self.strategies):
            raise ValueError(f"strategy listed twice in {','.join(self.strategies)}")
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if self.budget is not None and self.budget < 1:
            raise ValueError(f"budget must be a positive token count, got {self.budget}")
        if self.kv_bytes_per_token < 1:
            raise ValueError(f"kv_bytes_per_token must be >= 1, got {self.kv_bytes_per_token}")


@dataclass(slots=True)
class SessionRun:
    """One trajectory under one strategy: per-request series and session counters."""

    trajectory: str
    strategy: str
    harness: str = ""
    context: list[int] = field(default_factory=list)  # prompt tokens of each request
    cached: list[int] = field(default_factory=list)  # of which served from the prefix cache
    rewrites: int = 0
    over_budget: int = 0
    compactions: int = 0  # over the session
    stubs: int = 0  # in the final rendering
    folded_steps: int = 0  # in the final rendering
    # Where the tokens went, summed over the requests (count_tokens units): what the strategy
    # added, what its stubs and folds removed, and the previous prompt's tokens that a
    # rewrite made the replica prefill again (from the first changed token to its end).
    overhead_tokens: int = 0
    stub_saved_tokens: int = 0
    fold_saved_tokens: int = 0
    reprefill_tokens: int = 0
    # What each operator removed (``RenderStats.removed``), summed over the requests.
    removed: dict[str, int] = field(default_factory=dict)

    @property
    def prompt_tokens(self) -> int:
        return sum(self.context)

    @property
    def uncached_tokens(self) -> int:
        return self.prompt_tokens - sum(self.cached)

    @property
    def peak_context(self) -> int:
        return max(self.context, default=0)


@dataclass(frozen=True, slots=True)
class StrategyTotals:
    strategy: str
    sessions: int
    requests: int
    prompt_tokens: int
    uncached_tokens: int
    hit_rate: float
    peak_context: int
    mean_peak_kv_gib: float
    max_peak_kv_gib: float
    rewrites: int
    over_budget: int
    compactions: int
    stubs: int
    folded_steps: int
    overhead_tokens: int = 0
    stub_saved_tokens: int = 0
    fold_saved_tokens: int = 0
    reprefill_tokens: int = 0


@dataclass(slots=True)
class ReplayResult:
    tokenizer: str
    tokenizer_is_estimate: bool
    config: ReplayConfig
    runs: list[SessionRun]
    fold_active: list[str]  # sessions replayed with ReFold's fold operator on
    totals: dict[str, StrategyTotals] = field(default_factory=dict)

    def operators_note(self) -> str:
        """Which ReFold operators this replay exercised."""
        if not any(parse_spec(spec).has("refold") for spec in self.config.strategies):
            return "ReFold operators: n/a (no refold strategy)"
        sessions = self.trajectory_count
        if self.config.fold == "off":
            fold = "fold off (--fold off)"
        elif self.config.fold == "on":
            fold = f"fold on in all {sessions} sessions (--fold on: fold prompt and reminders)"
        elif self.config.fold == "auto":
            fold = f"fold auto in all {sessions} sessions (asked; ignored asks leave)"
        elif self.fold_active:
            fold = f"fold active in {len(self.fold_active)} of {sessions} sessions"
        else:
            fold = "fold inactive: no PROGRESS/STALE lines in the recorded replies"
        operators = ", ".join(o.name for o in registered())
        return f"ReFold operators: dedup: yes; harness folds ({operators}): yes; protocol {fold}"

    def removed_by_harness(self) -> dict[tuple[str, str], tuple[int, dict[str, int]]]:
        """(harness, strategy) -> (prompt tokens, tokens each operator removed), summed
        over the sessions and their requests."""
        out: dict[tuple[str, str], tuple[int, dict[str, int]]] = {}
        for r in self.runs:
            prompt, removed = out.get((r.harness, r.strategy), (0, {}))
            for operator, tokens in r.removed.items():
                removed[operator] = removed.get(operator, 0) + tokens
            out[(r.harness, r.strategy)] = (prompt + r.prompt_tokens, removed)
        return out

    @property
    def trajectory_count(self) -> int:
        return len({r.trajectory for r in self.runs})

    def to_json(self) -> dict[str, Any]:
        return {
            "tokenizer": self.tokenizer,
            "tokenizer_is_estimate": self.tokenizer_is_estimate,
            "config": asdict(self.config),
            "refold_operators": self.operators_note(),
            "fold_active": self.fold_active,
            "totals": {s: asdict(t) for s, t in self.totals.items()},
            "sessions": [
                {
                    "trajectory": r.trajectory,
                    "strategy": r.strategy,
                    "prompt_tokens": r.prompt_tokens,
                    "uncached_tokens": r.uncached_tokens,
                    "peak_context": r.peak_context,
                    "rewrites": r.rewrites,
                    "over_budget": r.over_budget,
                    "compactions": r.compactions,
                    "stubs": r.stubs,
                    "folded_steps": r.folded_steps,
                    "overhead_tokens": r.overhead_tokens,
                    "stub_saved_tokens": r.stub_saved_tokens,
                    "fold_saved_tokens": r.fold_saved_tokens,
                    "reprefill_tokens": r.reprefill_tokens,
                    "harness": r.harness,
                    "removed": r.removed,
                    "context": r.context,
                    "cached": r.cached,
                }
                for r in self.runs
            ],
        }


def requests_of(
    history: Transcript, compaction_indices: Sequence[int] = ()
) -> Iterator[Transcript]:
    """The requests a harness sent: before each assistant reply, everything still live.

    ``compaction_indices`` mark where the harness compacted its own context (Claude Code):
    from such an index on, it sent its system messages and the messages from that index
    (the summary) on, not the turns before it.
    """
    messages = history.messages
    system = tuple(itertools.takewhile(lambda m: m.role == "system", messages))
    start = 0
    for i, m in enumerate(messages):
        if i in compaction_indices:
            start = max(i, len(system))
        if m.role == "assistant":
            live = messages[:i] if start == 0 else system + messages[start:i]
            yield history.with_messages(live)


def harness_of(trajectory: TrajectoryLike) -> str:
    """The harness that recorded the run: for a normalized record, its ``source`` (the
    importer's ``harness`` is then the file format), else the importer's."""
    meta = getattr(trajectory, "meta", None)  # optional: Trajectory has it, fakes may not
    source = meta.get("source") if isinstance(meta, Mapping) else None
    return source if isinstance(source, str) and source else trajectory.harness


def request_count(history: Transcript) -> int:
    return sum(1 for m in history.messages if m.role == "assistant")


def carries_fold_lines(history: Transcript) -> bool:
    """True when some reply starts with ReFold's PROGRESS/STALE protocol lines."""
    return any(m.role == "assistant" and _FOLD_LINES.search(m.text) for m in history.messages)


def _is_extension(previous: Sequence[Message], current: Sequence[Message]) -> bool:
    return len(current) >= len(previous) and tuple(current[: len(previous)]) == tuple(previous)


def replay_session(
    trajectory: TrajectoryLike,
    renderer: Renderer,
    strategy: str,
    chat: ChatTokenizer,
    config: ReplayConfig,
    on_request: Callable[[], None] | None = None,
) -> SessionRun:
    """Replay one trajectory under one strategy."""
    run = SessionRun(trajectory=trajectory.id, strategy=strategy, harness=harness_of(trajectory))
    sim = PrefixCache(block_size=config.block_size, capacity_blocks=config.cache_blocks)
    prompts = SessionPrompts(chat)
    cache: Any = None
    previous: tuple[Message, ...] | None = None
    previous_ids: list[int] = []
    compactions_seen = 0
    for request in requests_of(trajectory.transcript, trajectory.compaction_indices):
        rendered = renderer.render(request, None, cache)
        cache = rendered.cache
        messages = rendered.transcript.messages
        ids = prompts.prompt_ids(rendered.transcript)
        result = sim.request(ids)
        run.context.append(result.prompt_tokens)
        run.cached.append(result.cached_tokens)
        if previous is not None and not _is_extension(previous, messages):
            run.rewrites += 1
            # The generation prompt closes every prompt; it is not part of what changed.
            sent = len(previous_ids) - len(prompts.chat.text_ids(GENERATION_PROMPT))
            run.reprefill_tokens += max(0, sent - _common_prefix(previous_ids, ids))
        stats = rendered.stats
        run.overhead_tokens += stats.overhead_tokens
        run.stub_saved_tokens += stats.stub_saved_tokens
        run.fold_saved_tokens += stats.fold_saved_tokens
        for operator, tokens in stats.removed:
            run.removed[operator] = run.removed.get(operator, 0) + tokens
        if config.budget is not None and result.prompt_tokens > config.budget:
            run.over_budget += 1
        # RenderStats counts compactions over the renderer's cache so far; the counter
        # restarts when the cache does (after a harness compaction), so add up increases.
        grown = stats.compactions - compactions_seen
        run.compactions += grown if grown >= 0 else stats.compactions
        compactions_seen = stats.compactions
        # stubs and folded steps describe this rendering: the final one describes the session
        run.stubs, run.folded_steps = stats.stubs, stats.folded_steps
        previous, previous_ids = messages, ids
        if on_request is not None:
            on_request()
    return run


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _totals(strategy: str, runs: list[SessionRun], kv_bytes: int) -> StrategyTotals:
    prompt = sum(r.prompt_tokens for r in runs)
    uncached = sum(r.uncached_tokens for r in runs)
    peaks_gib = [r.peak_context * kv_bytes / GIB for r in runs]
    return StrategyTotals(
        strategy=strategy,
        sessions=len(runs),
        requests=sum(len(r.context) for r in runs),
        prompt_tokens=prompt,
        uncached_tokens=uncached,
        hit_rate=(prompt - uncached) / prompt if prompt else 0.0,
        peak_context=max((r.peak_context for r in runs), default=0),
        mean_peak_kv_gib=sum(peaks_gib) / len(peaks_gib) if peaks_gib else 0.0,
        max_peak_kv_gib=max(peaks_gib, default=0.0),
        rewrites=sum(r.rewrites for r in runs),
        over_budget=sum(r.over_budget for r in runs),
        compactions=sum(r.compactions for r in runs),
        stubs=sum(r.stubs for r in runs),
        folded_steps=sum(r.folded_steps for r in runs),
        overhead_tokens=sum(r.overhead_tokens for r in runs),
        stub_saved_tokens=sum(r.stub_saved_tokens for r in runs),
        fold_saved_tokens=sum(r.fold_saved_tokens for r in runs),
        reprefill_tokens=sum(r.reprefill_tokens for r in runs),
    )


def build_renderers(
    config: ReplayConfig,
    chat: ChatTokenizer,
    make_renderer: RendererFactory | None = None,
    *,
    fold: str = "on",
) -> dict[str, Renderer]:
    """One renderer per strategy (shared by all sessions: caches are kept per session).

    ``make_renderer(spec, k=..., budget=..., count_tokens=...)`` defaults to the registry in
    ``gateway.fold``; an unknown spec raises its ``ValueError``. Renderers count tokens with
    ``chat`` so their budgets use the replay's tokenizer (and share its memo). ``fold`` is
    ReFold's fold mode ("auto", "on", "off") in the specs that contain refold.
    """
    if make_renderer is None:
        from gateway.fold import make_renderer
    count_tokens: TokenCount = chat.message_count
    renderers = {}
    for spec in config.strategies:
        renderers[spec] = make_renderer(
            spec, k=config.k, budget=config.budget, count_tokens=count_tokens, fold=fold
        )
    return renderers


def replay(
    trajectories: Iterable[TrajectoryLike],
    chat: ChatTokenizer,
    config: ReplayConfig,
    make_renderer: RendererFactory | None = None,
    on_request: Callable[[], None] | None = None,
) -> ReplayResult:
    """Replay every trajectory under every strategy of ``config``.

    ``make_renderer`` is passed to :func:`build_renderers`; ``on_request`` is called after
    each rendered request (progress bars).
    """
    renderer_sets: dict[str, dict[str, Renderer]] = {}
    runs: list[SessionRun] = []
    fold_active: list[str] = []
    for trajectory in trajectories:
        fold = config.fold
        if fold == "recorded":
            fold = "on" if carries_fold_lines(trajectory.transcript) else "off"
        if fold != "off":
            fold_active.append(trajectory.id)
        if fold not in renderer_sets:
            renderer_sets[fold] = build_renderers(config, chat, make_renderer, fold=fold)
        for strategy, renderer in renderer_sets[fold].items():
            runs.append(replay_session(trajectory, renderer, strategy, chat, config, on_request))
    result = ReplayResult(
        tokenizer=chat.counter.name,
        tokenizer_is_estimate=chat.counter.is_estimate,
        config=config,
        runs=runs,
        fold_active=fold_active,
    )
    for s in config.strategies:
        mine = [r for r in runs if r.strategy == s]
        result.totals[s] = _totals(s, mine, config.kv_bytes_per_token)
    return result
