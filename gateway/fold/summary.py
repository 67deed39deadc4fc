"""CliffCompaction's summary: the one user message standing for the compacted messages.

``head_end`` is where the verbatim head ends; ``SummaryBuilder`` writes the summary
candidates of one compaction, rung by rung of the ladder (see ``cliff.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.transcript import Message, Opaque, observation_indices, text_message

if TYPE_CHECKING:
    from gateway.fold.cliff import Cliff


@dataclass(frozen=True, slots=True)
class Caps:
    """Caps on assistant text and thinking in a summary (None: uncapped)."""

    assistant: int | None
    thinking: int | None


@dataclass(frozen=True, slots=True)
class Candidate:
    """One way to compact: the verbatim tail from ``cut``, the summary standing before it."""

    cut: int
    summary: Message | None
    summary_tokens: int
    kept_tokens: int
    rung: int

    def total(self, head_tokens: int) -> int:
        return head_tokens + self.summary_tokens + self.kept_tokens


def head_end(messages: Sequence[Message]) -> int:
    """End of the verbatim head: the leading system messages and the first user message."""
    i = 0
    while i < len(messages) and messages[i].role == "system":
        i += 1
    if i < len(messages) and messages[i].role == "user":
        i += 1
    return i


def cap_text(text: str, limit: int | None) -> str:
    """``text`` cut to ``limit`` characters with a marker saying how much went."""
    if limit is None or len(text) <= limit:
        return text
    if limit == 0:
        return ""  # a cap of 0 leaves the part out
    return f"{text[:limit]}… [{len(text) - limit} more characters]"


def lines_up(source: Sequence[Message], context: Sequence[Message]) -> bool:
    """``context`` renders ``source`` place for place (a non-empty one)."""
    return bool(source) and rewritten_in_place(context, source)


def rewritten_in_place(now: Sequence[Message], was: Sequence[Message]) -> bool:
    """Same length, and each message keeps its role and its tool-call ids."""
    return len(now) == len(was) and all(
        a.role == b.role
        and a.tool_call_id == b.tool_call_id
        and [c.id for c in a.tool_calls] == [c.id for c in b.tool_calls]
        for a, b in zip(now, was, strict=True)
    )


class SummaryBuilder:
    """Builds summary candidates for one compaction at ``pos``, whose verbatim tail starts
    at ``cut`` or later: token counts from ``messages`` (what is sent), summary entries from
    ``source`` when it lines up with them (see ``Cliff.follow``), else from ``messages``."""

    def __init__(
        self,
        cliff: Cliff,
        messages: tuple[Message, ...],
        source: tuple[Message, ...],
        head: int,
        cut: int,
        pos: int,
    ) -> None:
        self.cliff = cliff
        lined_up = len(source) >= pos and rewritten_in_place(source[:pos], messages[:pos])
        self.messages = source if lined_up else messages
        self.head = head
        self.cut = cut
        # Observations as the prefix shows them (text-action harnesses: user messages).
        self.observations = frozenset(observation_indices(self.messages[:pos]))
        self._kept = [cliff.count_tokens(m) for m in messages[cut:pos]]
        self._entries: dict[tuple[int, Caps], list[str]] = {}

    def kept_tokens(self, cut: int) -> int:
        return sum(self._kept[cut - self.cut :])

    def entries(self, cut: int, caps: Caps) -> list[str]:
        key = (cut, caps)
        if key not in self._entries:
            self._entries[key] = self._summarise(cut, caps)
        return self._entries[key]

    def candidate(self, rung: int, cut: int, caps: Caps, drop: int) -> Candidate:
        if cut <= self.head:
            return Candidate(cut, None, 0, self.kept_tokens(cut), rung)
        entries = self.entries(cut, caps)
        lines = [
            f"[Earlier conversation compacted: {cut - self.head} messages are summarised "
            f"below, oldest first. Tool calls are shown as signatures; tool results longer "
            f"than {self.cliff.result_max} characters were dropped.]"
        ]
        if drop:
            lines.append(f"[The {drop} oldest summary entries were cut to fit the context.]")
        lines.extend(entries[drop:])
        summary = text_message("user", "\n".join(lines))
        tokens = self.cliff.count_tokens(summary)
        return Candidate(cut, summary, tokens, self.kept_tokens(cut), rung)

    def _summarise(self, cut: int, caps: Caps) -> list[str]:
        cliff = self.cliff
        call_names: dict[str, str] = {}
        out: list[str] = []
        for i in range(self.head, cut):
            m = self.messages[i]
            if i in self.observations:
                out.append(self._result(m, call_names))
            elif m.role == "assistant":
                thinking = cap_text(m.thinking, caps.thinking)
                if thinking:
                    out.append(f"assistant thinking: {thinking}")
                text = cap_text(m.text, caps.assistant)
                if text:
                    out.append(f"assistant: {text}")
                for call in m.tool_calls:
                    call_names[call.id] = call.name
                    out.append(f"call: {call.name}({cap_text(call.arguments, cliff.call_arg_cap)})")
            else:
                text = cap_text(m.text, cliff.user_cap)
                attachments = sum(1 for p in m.parts if isinstance(p, Opaque))
                if attachments:
                    text += f" [{attachments} attachment(s) omitted]"
                if text:
                    out.append(f"{m.role}: {text}")
        return out

    def _result(self, m: Message, call_names: dict[str, str]) -> str:
        if m.role == "tool":
            label = f"result of {call_names.get(m.tool_call_id or '', 'a tool call')}"
        else:
            label = "observation"
        if m.is_error:
            label += " (error)"
        text = m.text
        if len(text) > self.cliff.result_max:
            return f"{label}: dropped ({len(text)} characters)"
        return f"{label}: {text}"
