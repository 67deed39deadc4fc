"""ReFold (Su, Tian, Zhang, Kundu, 2026): reversible inter-turn context folding, priced.

The history is never changed; only the rendering is compressed. Every choice here follows
from one fact about the serving side: the replica caches the previous request's prompt, so
text that was already sent costs almost nothing to send again *unchanged*, and everything
after the first changed token must be prefilled again. Hence:

- **Each output is rendered once, when it arrives, and then stays as it is** — unless a
  priced fold rewrites it (below). Deduplication happens at arrival: a span that an earlier
  shown output holds verbatim becomes a one-line stub naming that output (see
  ``dedup.py``). Stubbing new text invalidates nothing, so dedup never rewrites; and since
  the first copy is never folded while a stub names it, the content stays on screen.
- **Protocol text only while it can pay.** Fold mode ``on`` is the paper's setting: the
  system prompt asks for ``PROGRESS``/``STALE`` lines, every output is labelled
  ``[step N]``, and the ``restore`` tool is offered from the start. Mode ``auto`` (the
  default) asks at the end of the newest output instead; a reply that follows it makes the
  protocol live (the ask stays where the model read it, later outputs get labels). An ask
  or reminder the next reply ignores disappears from the rendering: it sat at the very end
  of the prompt, so dropping it costs no cached token. After ``MAX_ASKS`` ignored asks the
  session gets no more asks for good. Mode ``off`` never asks.
- **Folds are priced** (``pricing.py``). With ``t`` steps the boundary is
  ``B = max(0, k * floor((t - k) / k))``; when it moves, the steps below it that the model
  marked stale (accepted only from replies made while the step sat in the last full chunk)
  are candidates. Folding them saves their tokens on every later request and re-prefills
  everything after the first changed output (and, the first time, everything after the
  tool schemas, since that is where the ``restore`` tool is added). The fold is applied
  when the saving, weighted by the replica's KV pressure, beats the re-prefill; otherwise
  the candidates wait for the next boundary move, where they are priced again with more
  requests behind them. A decision is taken as of the step that moved the boundary, so a
  warm render and a cold one take the same decisions (for the same pressure).
- **Harness folds** need no protocol, so they apply in every fold mode: fold operators
  (``gateway.fold.operators``: ``progress`` reads the harness's task list, ``superseded``
  a call made again) claim steps as they arrive, and a claimed step is a fold candidate
  like a stale mark, priced the same way, unless a later message refers to it
  (``gateway.fold.references``). The model's restores of an operator's folds are counted;
  after ``STRIKES`` of them the session stops applying that operator.
- Codex's JSON-wrapped outputs are deduplicated inside their ``output`` string
  (``json_output.py``).
- Folding replaces tool outputs only; assistant messages render unchanged, so every tool
  message still follows its call. A run of adjacent folded steps puts one note in its
  first output and a pointer line in the others.
- Restored messages (``RenderState.restored``) render verbatim, are not steps and never
  enter the dedup index; pinned steps are never stubbed or folded.

The cache is updated in place and returned; it is checked against the history it was
built for (same messages, same restored set, same parameters) and ignored when they differ.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, ClassVar

from gateway.fold.calls import (
    FileView,
    describe_producer,
    path_from_call,
    path_from_command,
    view_from_call,
    view_from_command,
)
from gateway.fold.dedup import dedup_output
from gateway.fold.folds import PROTOCOL, decide_folds
from gateway.fold.json_output import unwrap
from gateway.fold.operators import STRIKES, FoldOperator, StepView, registered
from gateway.fold.protocol import (
    FOLD_INSTRUCTION,
    accepted_stale,
    ask_text,
    parse_reply,
    reminder_text,
)
from gateway.fold.references import said
from gateway.fold.refold_cache import PendingNote, ReFoldCache
from gateway.fold.registry import Strategy, register
from gateway.fold.renderer import (
    ADDED,
    STUB,
    Rendered,
    Renderer,
    RenderState,
    RenderStats,
    TokenCount,
    estimate_tokens,
    noted_kind,
    origin_kind,
    removed_by,
)
from gateway.fold.restore import (
    parse_restore_spec,
    restore_tool_name,
    restore_tool_schema,
    restore_tool_tokens,
    text_restore,
)
from gateway.transcript import Message, Text, ToolCall, Transcript, text_message

FOLD_MODES = ("auto", "on", "off")
# Ignored asks after which a session in mode "auto" is never asked again.
MAX_ASKS = 2


def chunk_boundary(steps: int, k: int) -> int:
    """Steps below this may be folded: ``max(0, k * floor((steps - k) / k))``."""
    return max(0, k * ((steps - k) // k))


def fold_mode(fold: bool | str) -> str:
    """``"auto"``, ``"on"`` or ``"off"``; ``True``/``False`` mean on/off."""
    if fold is True or fold is False:
        return "on" if fold else "off"
    if fold not in FOLD_MODES:
        raise ValueError(f"ReFold fold mode must be one of {', '.join(FOLD_MODES)}, got {fold!r}")
    return fold


class ReFold(Renderer):
    name: ClassVar[str] = "refold"

    def __init__(
        self,
        k: int = 3,
        dedup: bool = True,
        fold: bool | str = "auto",
        count_tokens: TokenCount = estimate_tokens,
        operators: bool | tuple[str, ...] = True,
    ) -> None:
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"ReFold chunk size k must be a positive integer, got {k!r}")
        self.operators = _operators(operators)
        self.k = k
        self.dedup = dedup
        self.fold = fold_mode(fold)
        self.count_tokens = count_tokens
        self._restore_tool_tokens = restore_tool_tokens(count_tokens)

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
        messages = list(c.out)
        kinds = [ADDED] * len(c.head) + c.kinds
        note = self._note_message(c)
        if note is not None:
            at = c.steps[c.note.step]  # type: ignore[union-attr]
            messages[at] = note
            kinds[len(c.head) + at] = c.note.kind  # type: ignore[union-attr]
        tools = history.tools
        overhead = c.overhead
        restore_tool = None
        if c.restore_offered and tools and not c.text_mode:
            restore_tool = restore_tool_name(tools)
            tools = (*tools, restore_tool_schema(restore_tool))
            overhead += self._restore_tool_tokens
        if note is not None:
            overhead += self.count_tokens(note) - c.tokens[c.steps[c.note.step]]  # type: ignore[union-attr]
        stats = RenderStats(
            steps=len(c.steps),
            boundary=chunk_boundary(len(c.steps), self.k),
            stubs=c.stubs,
            folded_steps=len(c.folded),
            reminders=int(note is not None and not c.note.ask),  # type: ignore[union-attr]
            overhead_tokens=overhead,
            stub_saved_tokens=c.stub_saved,
            fold_saved_tokens=c.fold_saved,
            rewrites=c.rewrites,
            reprefill_tokens=c.reprefill,
            restore_tool=restore_tool,
            text_restores=c.text_mode and (c.restore_offered or c.index.restore_hint),
            removed=removed_by((("dedup", c.stub_saved),), tuple(c.fold_saved_by.items())),
            undone_folds=len(c.undone_steps),
            stopped_rules=tuple(sorted(c.stopped)),
        )
        rendered = replace(history, messages=(*c.head, *messages), tools=tuple(tools))
        sources = (None,) * len(c.head) + tuple(range(len(messages)))
        return Rendered(rendered, c, stats, sources, tuple(kinds))

    # -- cache -------------------------------------------------------------------------

    def _key(self, state: RenderState) -> tuple[Any, ...]:
        return (self.k, self.dedup, self.fold, state.pinned, tuple(o.name for o in self.operators))

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
        protocol = {"on": "on", "off": "off", "auto": "asking"}[self.fold]
        c = ReFoldCache(key=self._key(state), text_mode=text_mode, protocol=protocol)
        c.restore_offered = protocol == "on"
        c.index.restore_hint = protocol == "on"
        c.operator_states = {o.name: o.start() for o in self.operators}
        if protocol == "on" and (not history.messages or history.messages[0].role != "system"):
            c.head = (text_message("system", FOLD_INSTRUCTION),)
            c.overhead += self.count_tokens(c.head[0])
        return c

    # -- scan: each new message is rendered once, as it arrives ------------------------

    def _scan(self, c: ReFoldCache, history: Transcript, state: RenderState) -> None:
        messages = history.messages
        for pos in range(len(c.seen), len(messages)):
            m = messages[pos]
            if pos in state.restored:
                # The reply right before a restored message asked for the restore.
                if c.gap and c.gap[-1][0] == pos - 1:
                    c.gap.pop()
                _count_undone(c, m)
                self._put(c, m, m)
            elif m.role == "assistant":
                self._scan_reply(c, pos, m)
                if self.operators and (words := said(m)) is not None:
                    c.said[pos] = words
                self._put(c, m, m)
            elif (m.role == "tool") if not c.text_mode else _is_observation(c, m):
                self._scan_step(c, history, state, pos, m)
            else:
                if self.operators and m.role == "user" and (words := said(m)) is not None:
                    c.said[pos] = words
                self._put(c, m, self._plain(c, pos, m))
        c.seen = messages
        c.restored = frozenset(i for i in state.restored if i < len(messages))

    def _put(
        self, c: ReFoldCache, original: Message, rendered: Message, tokens: int | None = None
    ) -> None:
        """Render the next history position: ``original`` shown as ``rendered``."""
        c.out.append(rendered)
        c.tokens.append(self.count_tokens(rendered) if tokens is None else tokens)
        c.kinds.append(origin_kind(original, rendered, STUB))

    def _scan_reply(self, c: ReFoldCache, pos: int, m: Message) -> None:
        if c.first_reply is None:
            c.first_reply = pos
        for call in m.tool_calls:
            c.calls[call.id] = call
        c.last_reply = m.text
        c.replied = True
        c.requests += 1
        if c.protocol in ("off", "abandoned"):
            c.note = None
            return
        reply = parse_reply(m.text)
        note, c.note = c.note, None
        if c.protocol == "asking" and reply.complete and (note is None or not note.ask):
            c.protocol = "live"  # the model writes the lines unasked (its prompt asks it)
        elif note is not None and note.ask:
            if reply.complete:
                # The model followed the ask: it stays where the model read it.
                c.protocol = "live"
                at = c.steps[note.step]
                c.out[at] = self._note_message(c, note)
                c.kinds[at] = note.kind
                c.overhead += self.count_tokens(c.out[at]) - c.tokens[at]
                c.tokens[at] = self.count_tokens(c.out[at])
            else:
                c.asks += 1
                if c.asks >= MAX_ASKS:
                    c.protocol = "abandoned"
                    return
        if c.protocol not in ("on", "live"):
            return
        c.stale |= accepted_stale(reply, len(c.steps), self.k)
        if reply.progress is not None:
            for step in c.awaiting:
                c.progress[step] = reply.progress
            c.awaiting.clear()
        c.gap.append((pos, reply.complete))

    def _scan_step(
        self, c: ReFoldCache, history: Transcript, state: RenderState, pos: int, m: Message
    ) -> None:
        step = len(c.steps)
        c.steps.append(pos)
        c.step_of[pos] = step
        producer = c.last_reply if c.text_mode else c.calls.get(m.tool_call_id or "")
        c.producers.append(producer)
        c.progress.append(None)
        if c.replied:  # a PROGRESS line is only taken from the replies right after a step
            c.awaiting.clear()
            c.replied = False
        c.awaiting.append(step)
        for _, complete in c.gap:
            c.misses = 0 if complete else c.misses + 1
        if c.gap and not c.gap[-1][1]:
            c.note = PendingNote(step, reminder_text(c.misses), ask=False)
        elif c.note is not None:
            # Parallel outputs: the note moves to the newest, the end of the prompt.
            c.note = PendingNote(step, c.note.text, c.note.ask)
        c.gap.clear()
        labelled = c.protocol in ("on", "live")
        original = self.count_tokens(m)
        text = m.text
        if self.dedup and step not in state.pinned:
            c.index.restore_hint = c.restore_offered or (c.text_mode and c.protocol == "on")
            described = describe_producer(producer)
            if not labelled and described:
                c.index.names[step] = f"step {step} (`{described}`)"
            wrapped = unwrap(text)
            inner = wrapped.inner if wrapped is not None else text
            inner, stubs = dedup_output(
                inner, step, c.index, _path_hint(producer), _view_hint(producer)
            )
            text = wrapped.with_inner(inner) if wrapped is not None else inner
        deduped = m if text == m.text else m.with_text(text)
        deduped_tokens = original if deduped is m else self.count_tokens(deduped)
        if deduped_tokens >= original:
            # Shorter in characters is not always fewer tokens: a stub never costs more.
            # What it would have hidden stays shown; the index only misses some of it.
            text, deduped, deduped_tokens = m.text, m, original
        if deduped is not m:
            c.stubs += stubs
            c.step_stubs[step] = (stubs, original - deduped_tokens)
        c.stub_saved += original - deduped_tokens
        rendered = deduped.with_text(f"[step {step}]\n{text}") if labelled else deduped
        self._put(c, m, rendered, None if labelled else deduped_tokens)
        c.overhead += c.tokens[pos] - deduped_tokens
        if c.protocol == "asking" and (c.note is None or c.note.ask):
            c.note = PendingNote(step, ask_text(step), ask=True)
        for operator in self.operators:
            view = StepView(
                step,
                pos,
                producer if isinstance(producer, ToolCall) else None,
                producer if isinstance(producer, str) else None,
                m.text,
            )
            for claim in operator.observe(c.operator_states[operator.name], view):
                if claim.step not in c.folded and claim.step not in state.pinned:
                    c.claims[claim.step] = (operator.name, claim)
        boundary = chunk_boundary(len(c.steps), self.k)
        if boundary > c.decided:
            if c.protocol in ("on", "live") or c.claims:
                decide_folds(
                    c, history, state, boundary, pos, self.count_tokens, self._restore_tool_tokens
                )
            c.decided = boundary

    def _plain(self, c: ReFoldCache, pos: int, m: Message) -> Message:
        """A message that is not a step: verbatim, except the protocol in the system prompt."""
        if pos == 0 and m.role == "system" and c.protocol == "on":
            rendered = replace(m, parts=(*m.parts, Text("\n\n" + FOLD_INSTRUCTION)))
            c.overhead += self.count_tokens(rendered) - self.count_tokens(m)
            return rendered
        return m

    # -- the transient note --------------------------------------------------------------

    def _note_message(self, c: ReFoldCache, note: PendingNote | None = None) -> Message | None:
        """The output carrying the pending ask or reminder, while no reply follows it."""
        note = note or c.note
        if note is None:
            return None
        if note.message is None:
            at = c.steps[note.step]
            note.message = c.out[at].with_text(f"{c.out[at].text}\n\n{note.text}")
            note.kind = noted_kind(c.kinds[at])
        return note.message


def _operators(operators: bool | tuple[str, ...]) -> tuple[FoldOperator, ...]:
    """The fold operators ReFold applies: all registered (True), none (False), or those
    named, in registration order."""
    known = registered()
    if operators is True or operators is False:
        return known if operators else ()
    names = {o.name for o in known}
    unknown = sorted(set(operators) - names)
    if unknown:
        raise ValueError(
            f"unknown fold operator(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}"
        )
    return tuple(o for o in known if o.name in operators)


def _count_undone(c: ReFoldCache, m: Message) -> None:
    """A restored message gives folded steps back: each counts against the rule that
    folded it, and a rule the model undid ``STRIKES`` times stops for the session."""
    if c.text_mode:
        spec = text_restore(c.last_reply)
    else:
        call = c.calls.get(m.tool_call_id or "")
        args = _json_object(call.arguments) if call is not None else {}
        spec = args.get("steps") if isinstance(args.get("steps"), str) else None
    if spec is None:
        return
    try:
        first, last = parse_restore_spec(spec)
    except ValueError:
        return
    for step in range(first, min(last, len(c.steps) - 1) + 1):
        rule = c.fold_rule.get(step)
        if rule is None or step in c.undone_steps:
            continue
        c.undone_steps.add(step)
        c.undone[rule] = c.undone.get(rule, 0) + 1
        if rule != PROTOCOL and c.undone[rule] >= STRIKES:
            c.stopped.add(rule)  # the model's own stale marks are its call, never stopped


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


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


register(
    Strategy(
        "refold",
        ReFold,
        settings=lambda s: (
            {"k": s.k, "dedup": True, "count_tokens": s.count_tokens}
            | ({} if s.fold is None else {"fold": s.fold})
        ),
        takes_fold_mode=True,
        # It keeps the rendered prefix as new message objects with their derived fields
        # (digests, token counts, stub index): 6x the text of bench/memory.py's sessions,
        # 7.3x of short source lines; charged 7x. And per message however short its text
        # (its objects): ~300-600 B over histories of many one-line messages; charged 400.
        cache_bytes_per_text_byte=7.0,
        cache_bytes_per_message=400,
    )
)
