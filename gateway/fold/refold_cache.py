"""ReFold's per-session cache: what the history holds so far, and its rendering."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.fold.dedup import DedupIndex
from gateway.fold.operators import FoldClaim
from gateway.fold.references import Anchors, Said
from gateway.fold.renderer import LABELLED
from gateway.transcript import Message, ToolCall


@dataclass(slots=True)
class PendingNote:
    """An ask or reminder shown at the end of one output while no reply follows it."""

    step: int
    text: str
    ask: bool
    message: Message | None = None  # the output with the note, made once
    kind: str = LABELLED  # what the inspector calls that message (see ``noted_kind``)


@dataclass(eq=False, slots=True)
class ReFoldCache:
    """Per-session state of ReFold: what the history holds so far and its rendering."""

    key: tuple[Any, ...]
    text_mode: bool
    protocol: str  # "on", "off", "asking", "live" or "abandoned"
    seen: tuple[Message, ...] = ()
    restored: frozenset[int] = frozenset()
    # scan of the history, one entry per step
    steps: list[int] = field(default_factory=list)  # history positions
    step_of: dict[int, int] = field(default_factory=dict)
    producers: list[ToolCall | str | None] = field(default_factory=list)
    progress: list[str | None] = field(default_factory=list)
    stale: set[int] = field(default_factory=set)
    first_reply: int | None = None
    calls: dict[str, ToolCall] = field(default_factory=dict)
    last_reply: str = ""
    awaiting: list[int] = field(default_factory=list)  # steps waiting for a PROGRESS line
    replied: bool = False
    gap: list[tuple[int, bool]] = field(default_factory=list)  # replies since the last step
    misses: int = 0
    asks: int = 0
    note: PendingNote | None = None
    requests: int = 0  # replies so far: each was one model request
    # rendering: one message per history position, and its token count
    out: list[Message] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)  # each one's origin kind (``origin_kind``)
    head: tuple[Message, ...] = ()
    index: DedupIndex = field(default_factory=DedupIndex)
    folded: set[int] = field(default_factory=set)
    decided: int = 0  # the boundary the last fold decision was taken at
    restore_offered: bool = False
    stubs: int = 0
    # per step: stubs in its rendering and the tokens they removed (until it is folded)
    step_stubs: dict[int, tuple[int, int]] = field(default_factory=dict)
    # fold operators (``gateway.fold.operators``): each one's session state, the claims
    # not yet folded (step -> (operator, claim)), the rule and note of each folded step,
    # what the agent's and user's messages say (position -> words), the reference check
    # done so far (step -> (claim point, checked up to, referred)), folds the model undid
    # by restoring (per rule, and the steps counted), and the rules stopped for it
    operator_states: dict[str, Any] = field(default_factory=dict)
    claims: dict[int, tuple[str, FoldClaim]] = field(default_factory=dict)
    fold_rule: dict[int, str] = field(default_factory=dict)
    fold_notes: dict[int, str] = field(default_factory=dict)
    said: dict[int, Said] = field(default_factory=dict)
    referred: dict[int, tuple[int, int, bool]] = field(default_factory=dict)
    anchors: dict[int, tuple[int, Anchors]] = field(default_factory=dict)  # of claimed steps
    undone: dict[str, int] = field(default_factory=dict)
    undone_steps: set[int] = field(default_factory=set)
    stopped: set[str] = field(default_factory=set)
    # accounting, in count_tokens units
    # tokens the folds remove, per rule ("protocol" or an operator's name)
    fold_saved_by: dict[str, int] = field(default_factory=dict)
    overhead: int = 0
    stub_saved: int = 0
    fold_saved: int = 0
    rewrites: int = 0
    reprefill: int = 0
