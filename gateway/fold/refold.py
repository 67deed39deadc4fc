"""ReFold (Su, Tian, Zhang, Kundu, 2026): reversible inter-turn context folding.

The history is never changed; only the rendering is compressed. With ``t`` steps (tool
outputs) the boundary is ``B = max(0, k * floor((t - k) / k))``: steps below B render
compressed (duplicates stubbed, stale steps folded), steps from B on render in full, each
output behind a ``[step N]`` line. Choices this module makes, and why:

- Compressed steps are final. A step below B can only be marked stale by replies made
  while it sat in the last full chunk, and all of those exist once B has passed it; its
  PROGRESS line comes from the replies before the next step. So the compressed prefix is
  computed once, in step order, and cached; only the open fold run at its end can grow.
- Folding replaces tool outputs only. Assistant messages (text, thinking with signatures,
  calls) render unchanged, so every tool message still follows its call. A run of
  adjacent folded steps puts one note in its first output and a pointer line in the
  others. A run may grow across a chunk edge; then the note is rewritten at that boundary
  move (the only place where a rewrite starts before the old boundary).
- Reminders go to the first output after the reply that omitted the protocol lines, and
  stay there while that step renders in full: the output is final when it is added, so
  between boundary moves the rendering only grows at its end (the prefix property).
  Compressed steps drop their reminders. A gateway restore exchange (a reply followed by
  a restored message) is not counted as a miss.
- Restored messages (``RenderState.restored``) render verbatim, are not steps and never
  enter the dedup index; pinned steps render in full everywhere and are never folded.
- The system prompt gets the protocol instruction as an extra text part (a new system
  message when there is none) when folding is on.

The cache is updated in place and returned; it is checked against the history it was
built for (same messages, same restored set, same parameters) and ignored when they differ.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from gateway.fold.protocol import (
    FOLD_INSTRUCTION,
    accepted_stale,
    fold_note,
    fold_pointer,
    parse_reply,
    reminder_text,
)
from gateway.fold.renderer import (
    Rendered,
    Renderer,
    RenderState,
    RenderStats,
    TokenCount,
    estimate_tokens,
)
from gateway.fold.spans import (
    DedupIndex,
    FileView,
    dedup_output,
    path_from_call,
    path_from_command,
    view_from_call,
    view_from_command,
)
from gateway.transcript import Message, Text, ToolCall, Transcript, text_message


def chunk_boundary(steps: int, k: int) -> int:
    """Steps below this render compressed: ``max(0, k * floor((steps - k) / k))``."""
    return max(0, k * ((steps - k) // k))


@dataclass(slots=True)
class _FoldRun:
    first: int
    last: int
    position: int  # history position of the first output (it holds the note)
    slot: int  # its index in the rendered prefix
    progress: list[str | None]


@dataclass(eq=False, slots=True)
class ReFoldCache:
    """Per-session state of ReFold: what the history holds so far and the rendered prefix."""

    key: tuple[Any, ...]
    text_mode: bool
    seen: tuple[Message, ...] = ()
    restored: frozenset[int] = frozenset()
    # scan of the history, one entry per step
    steps: list[int] = field(default_factory=list)  # history positions
    step_of: dict[int, int] = field(default_factory=dict)
    producers: list[ToolCall | str | None] = field(default_factory=list)
    progress: list[str | None] = field(default_factory=list)
    reminders: dict[int, int] = field(default_factory=dict)  # step -> consecutive misses
    stale: set[int] = field(default_factory=set)
    first_reply: int | None = None
    calls: dict[str, ToolCall] = field(default_factory=dict)
    last_reply: str = ""
    awaiting: list[int] = field(default_factory=list)  # steps waiting for a PROGRESS line
    replied: bool = False
    gap: list[tuple[int, bool]] = field(default_factory=list)  # replies since the last step
    misses: int = 0
    # rendering
    prefix: tuple[Message, ...] = ()
    prefix_end: int = 0
    boundary: int = 0
    index: DedupIndex = field(default_factory=DedupIndex)
    run: _FoldRun | None = None
    full: dict[int, Message] = field(default_factory=dict)
    stubs: int = 0
    folded: int = 0


class ReFold(Renderer):
    name: ClassVar[str] = "refold"

    def __init__(
        self,
        k: int = 3,
        dedup: bool = True,
        fold: bool = True,
        count_tokens: TokenCount = estimate_tokens,
    ) -> None:
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"ReFold chunk size k must be a positive integer, got {k!r}")
        self.k = k
        self.dedup = dedup
        self.fold = fold
        # Kept for the registry's uniform signature; stub decisions are made on characters.
        self.count_tokens = count_tokens

    def render(
        self, history: Transcript, state: RenderState | None = None, cache: Any = None
    ) -> Rendered:
        if not isinstance(history, Transcript):
            raise TypeError(f"ReFold renders a Transcript, got {type(history).__name__}")
        if state is not None and not isinstance(state, RenderState):
            raise TypeError(f"render state must be a RenderState, got {type(state).__name__}")
        state = state or RenderState()
        c = self._usable(cache, history, state) or self._fresh(history, state)
        self._scan(c, history, state)
        boundary = chunk_boundary(len(c.steps), self.k)
        self._advance(c, history, state, boundary)
        tail = [self._full(c, history, state, pos) for pos in range(c.prefix_end, len(c.seen))]
        head: tuple[Message, ...] = ()
        if self.fold and (not c.seen or c.seen[0].role != "system"):
            head = (text_message("system", FOLD_INSTRUCTION),)
        reminders = 0
        if self.fold:
            reminders = sum(
                1 for pos in range(c.prefix_end, len(c.seen)) if c.step_of.get(pos) in c.reminders
            )
        stats = RenderStats(
            steps=len(c.steps),
            boundary=boundary,
            stubs=c.stubs,
            folded_steps=c.folded,
            reminders=reminders,
        )
        return Rendered(history.with_messages(head + c.prefix + tuple(tail)), c, stats)

    # -- cache -------------------------------------------------------------------------

    def _key(self, state: RenderState) -> tuple[Any, ...]:
        return (self.k, self.dedup, self.fold, state.pinned)

    def _usable(self, cache: Any, history: Transcript, state: RenderState) -> ReFoldCache | None:
        """``cache`` when it was built for a prefix of this history, else None."""
        if not isinstance(cache, ReFoldCache) or cache.key != self._key(state):
            return None
        seen = len(cache.seen)
        messages = history.messages
        if len(messages) < seen or messages[:seen] != cache.seen:
            return None  # another branch, or an older state of this one
        if frozenset(i for i in state.restored if i < seen) != cache.restored:
            return None
        # A first tool message turns a text-action transcript into a tool-calling one.
        if cache.text_mode and any(m.role == "tool" for m in messages[seen:]):
            return None
        return cache

    def _fresh(self, history: Transcript, state: RenderState) -> ReFoldCache:
        text_mode = not any(m.role == "tool" for m in history.messages)
        return ReFoldCache(key=self._key(state), text_mode=text_mode)

    # -- scan: the facts each new message adds -----------------------------------------

    def _scan(self, c: ReFoldCache, history: Transcript, state: RenderState) -> None:
        messages = history.messages
        for pos in range(len(c.seen), len(messages)):
            m = messages[pos]
            if pos in state.restored:
                # The reply right before a restored message asked for the restore.
                if c.gap and c.gap[-1][0] == pos - 1:
                    c.gap.pop()
            elif m.role == "assistant":
                self._scan_reply(c, pos, m)
            elif (m.role == "tool") if not c.text_mode else _is_observation(c, m):
                self._scan_step(c, pos, m)
        c.seen = messages
        c.restored = frozenset(i for i in state.restored if i < len(messages))

    def _scan_reply(self, c: ReFoldCache, pos: int, m: Message) -> None:
        if c.first_reply is None:
            c.first_reply = pos
        for call in m.tool_calls:
            c.calls[call.id] = call
        c.last_reply = m.text
        c.replied = True
        if not self.fold:
            return
        reply = parse_reply(m.text)
        c.stale |= accepted_stale(reply, len(c.steps), self.k)
        if reply.progress is not None:
            for step in c.awaiting:
                c.progress[step] = reply.progress
            c.awaiting.clear()
        c.gap.append((pos, reply.complete))

    def _scan_step(self, c: ReFoldCache, pos: int, m: Message) -> None:
        step = len(c.steps)
        c.steps.append(pos)
        c.step_of[pos] = step
        if c.text_mode:
            c.producers.append(c.last_reply)
        else:
            c.producers.append(c.calls.get(m.tool_call_id or ""))
        c.progress.append(None)
        if c.replied:  # a PROGRESS line is only taken from the replies right after a step
            c.awaiting.clear()
            c.replied = False
        c.awaiting.append(step)
        for _, complete in c.gap:
            c.misses = 0 if complete else c.misses + 1
        if c.gap and not c.gap[-1][1]:
            c.reminders[step] = c.misses
        c.gap.clear()

    # -- render ------------------------------------------------------------------------

    def _advance(
        self, c: ReFoldCache, history: Transcript, state: RenderState, boundary: int
    ) -> None:
        """Compress the steps that fell below the boundary and extend the cached prefix."""
        end = c.steps[boundary] if c.steps else 0
        if end <= c.prefix_end:
            c.boundary = boundary
            return
        prefix = list(c.prefix)
        for pos in range(c.prefix_end, end):
            c.full.pop(pos, None)
            m = history.messages[pos]
            step = c.step_of.get(pos)
            if step is None:
                prefix.append(self._plain(pos, m, state))
            elif self.fold and step in c.stale and step not in state.pinned:
                self._fold(c, prefix, pos, m, step)
            else:
                c.run = None
                prefix.append(self._compressed(c, m, step, state))
        c.prefix = tuple(prefix)
        c.prefix_end = end
        c.boundary = boundary

    def _fold(self, c: ReFoldCache, prefix: list[Message], pos: int, m: Message, step: int) -> None:
        c.folded += 1
        run = c.run
        if run is not None and run.last == step - 1:
            run.last = step
            run.progress.append(c.progress[step])
            prefix.append(m.with_text(f"[step {step}]\n{fold_pointer(run.first)}"))
        else:
            run = c.run = _FoldRun(step, step, pos, len(prefix), [c.progress[step]])
            prefix.append(m)
        note = fold_note(run.first, run.last, run.progress)
        prefix[run.slot] = c.seen[run.position].with_text(f"[step {run.first}]\n{note}")

    def _compressed(self, c: ReFoldCache, m: Message, step: int, state: RenderState) -> Message:
        text = m.text
        if self.dedup and step not in state.pinned:
            producer = c.producers[step]
            text, stubs = dedup_output(
                text, step, c.index, _path_hint(producer), _view_hint(producer)
            )
            c.stubs += stubs
        return m.with_text(f"[step {step}]\n{text}")

    def _full(self, c: ReFoldCache, history: Transcript, state: RenderState, pos: int) -> Message:
        m = history.messages[pos]
        step = c.step_of.get(pos)
        if step is None:
            return self._plain(pos, m, state)
        rendered = c.full.get(pos)
        if rendered is None:
            text = f"[step {step}]\n{m.text}"
            if self.fold and step in c.reminders:
                text += "\n\n" + reminder_text(c.reminders[step])
            rendered = c.full[pos] = m.with_text(text)
        return rendered

    def _plain(self, pos: int, m: Message, state: RenderState) -> Message:
        """A message that is not a step: verbatim, except the protocol in the system prompt."""
        if pos == 0 and m.role == "system" and self.fold and pos not in state.restored:
            return replace(m, parts=(*m.parts, Text("\n\n" + FOLD_INSTRUCTION)))
        return m


def _is_observation(c: ReFoldCache, m: Message) -> bool:
    """Text-action transcripts: every user message after the first reply is an observation."""
    return m.role == "user" and c.first_reply is not None


def _path_hint(producer: ToolCall | str | None) -> str | None:
    if isinstance(producer, ToolCall):
        return path_from_call(producer.name, producer.arguments)
    return path_from_command(producer) if producer else None


def _view_hint(producer: ToolCall | str | None) -> FileView | None:
    if isinstance(producer, ToolCall):
        return view_from_call(producer.name, producer.arguments)
    return view_from_command(producer) if producer else None
