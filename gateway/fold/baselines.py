"""The paper's appendix-B baselines: ``base`` (nothing), ``mask`` and ``clip``.

Both compressing baselines only rewrite the content of old tool outputs (steps, as
``step_indices`` counts them); messages keep their role, place and ``tool_call_id``, so a
tool result never loses its call, and gateway-restored messages are never touched. They
re-render the whole history each call: the work is a copy per message, and their point in
experiments is to show what a prefix rewritten at every step costs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

from gateway.fold.registry import Strategy, register
from gateway.fold.renderer import (
    CLIPPED,
    MASKED,
    Rendered,
    Renderer,
    RenderState,
    RenderStats,
    origin_kind,
    step_indices,
    verbatim,
)
from gateway.transcript import Message, Text, Transcript


def require_int(name: str, value: object, minimum: int = 0) -> int:
    """``value`` if it is an integer >= ``minimum``; else an error naming the parameter."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


class Base(Renderer):
    """The uncompressed history, as sent."""

    name = "base"

    def render(
        self, history: Transcript, state: RenderState | None = None, cache: Any = None
    ) -> Rendered:
        stats = RenderStats(steps=len(step_indices(history, state)))
        return Rendered(history, None, stats, *verbatim(history))


class _OldOutputs(Renderer):
    """Rewrites every step older than the last ``keep_last`` with ``_rewrite``; ``kind``:
    what such a rewrite is called (``Rendered.kinds``)."""

    kind: ClassVar[str]

    def __init__(self, keep_last: int) -> None:
        self.keep_last = require_int("keep_last", keep_last)

    def _rewrite(self, message: Message, step: int) -> Message | None:
        """The replacement for step ``step``, or None to keep it as is."""
        raise NotImplementedError

    def render(
        self, history: Transcript, state: RenderState | None = None, cache: Any = None
    ) -> Rendered:
        steps = step_indices(history, state)
        old = steps[: max(0, len(steps) - self.keep_last)]
        messages = list(history.messages)
        sources, verbatim_kinds = verbatim(history)
        kinds = list(verbatim_kinds)
        changed = 0
        for step, index in enumerate(old):
            new = self._rewrite(messages[index], step)
            if new is not None:
                kinds[index] = origin_kind(messages[index], new, self.kind)
                messages[index] = new
                changed += 1
        stats = RenderStats(steps=len(steps), boundary=len(old), stubs=changed)
        return Rendered(history.with_messages(messages), None, stats, sources, tuple(kinds))


class Mask(_OldOutputs):
    """Outputs older than the last ``keep_last`` (10) become one line naming their step."""

    name = "mask"
    kind = MASKED

    def __init__(self, keep_last: int = 10) -> None:
        super().__init__(keep_last)

    def _rewrite(self, message: Message, step: int) -> Message:
        # All parts go (images too): the point of masking is that nothing old is re-read.
        return replace(message, parts=(Text(f"[output of step {step} omitted]"),))


class Clip(_OldOutputs):
    """Outputs older than the last ``keep_last`` (3) cut to ``max_chars`` (1,000) characters.

    The kept text is the first two thirds and the last third of the budget, with a marker
    between them saying how much was cut; non-text parts stay.
    """

    name = "clip"
    kind = CLIPPED

    def __init__(self, keep_last: int = 3, max_chars: int = 1_000) -> None:
        super().__init__(keep_last)
        self.max_chars = require_int("max_chars", max_chars)

    def _rewrite(self, message: Message, step: int) -> Message | None:
        text = message.text
        if len(text) <= self.max_chars:
            return None
        return message.with_text(clip_text(text, self.max_chars))


def clip_text(text: str, max_chars: int) -> str:
    """``text`` cut to its first 2/3 and last 1/3 of ``max_chars``, marker in between."""
    if len(text) <= max_chars:
        return text
    head = max_chars * 2 // 3
    tail = max_chars - head
    cut = len(text) - head - tail
    end = text[len(text) - tail :] if tail else ""
    return f"{text[:head]}\n[... {cut} characters clipped ...]\n{end}"


register(Strategy("base", Base))
register(Strategy("mask", Mask))
register(Strategy("clip", Clip))
