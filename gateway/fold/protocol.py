"""ReFold's fold protocol: what the model is asked to write, and reading it back.

Every reply should start with ``PROGRESS: <one line>`` and ``STALE: <steps or ->``. The
PROGRESS line becomes the step's summary once the step is folded; STALE names steps the
agent no longer needs. Parsing is tolerant (case, whitespace, markdown bold, bullets, and
the lines may come after other text), because a missed line costs a reminder, not a crash.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

FOLD_INSTRUCTION = (
    "Context protocol. Every tool output you see is labelled [step N]. Start every reply with "
    "exactly these two lines:\n"
    "PROGRESS: <one line: what you learned or did since your previous reply>\n"
    "STALE: <steps you will not need to read again, e.g. 4, 6-8, or - for none>\n"
    "Steps you mark stale may later be folded into a one-line note made of your PROGRESS "
    "lines. Nothing is lost: a folded or deduplicated step comes back verbatim when you call "
    'the `restore` tool with {"steps": "N"} or {"steps": "i-j"} (or, if you act through text '
    "commands, reply with the command `restore N` or `restore i-j`)."
)

# Optional bullet / quote, optional bold around the key and/or the colon, the key, the value
# up to the end of the line (``_value`` drops its closing bold). Possessive blanks and no
# lazy value before an optional tail: linear in the line, a line of spaces included.
_LINE = re.compile(
    r"^[ \t]*+(?:[-*>][ \t]++)?(?:\*\*|__)?[ \t]*+(PROGRESS|STALE)[ \t]*+(?:\*\*|__)?[ \t]*+:"
    r"[ \t]*+(?:\*\*|__)?+(.*)",
    re.IGNORECASE | re.MULTILINE,
)
_STEP_RANGE = re.compile(r"(\d+)(?:\s*(?:-|–|—|\.\.|to)\s*(\d+))?", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class ProtocolReply:
    """The two protocol lines of one reply; ``None`` where the line is missing."""

    progress: str | None
    # Inclusive step ranges as written (not yet checked against the accepted window).
    stale: tuple[tuple[int, int], ...] | None

    @property
    def complete(self) -> bool:
        return self.progress is not None and self.stale is not None


def parse_reply(text: str) -> ProtocolReply:
    """Read the first PROGRESS line and the first STALE line of an assistant reply."""
    progress: str | None = None
    stale: tuple[tuple[int, int], ...] | None = None
    for match in _LINE.finditer(text):
        key, value = match.group(1).upper(), _value(match.group(2)).strip()
        if key == "PROGRESS" and progress is None:
            progress = value
        elif key == "STALE" and stale is None:
            stale = parse_stale(value)
    return ProtocolReply(progress, stale)


def _value(rest: str) -> str:
    """A protocol line's value: the rest of the line without trailing blanks around one
    closing ``**`` or ``__``."""
    value = rest.rstrip(" \t")
    return value[:-2].rstrip(" \t") if value.endswith(("**", "__")) else value


def parse_stale(value: str) -> tuple[tuple[int, int], ...]:
    """``"3, 5-7"`` -> ((3, 3), (5, 7)); ``"-"``, ``"none"`` or text without numbers -> ()."""
    ranges = []
    for match in _STEP_RANGE.finditer(value):
        lo = int(match.group(1))
        hi = int(match.group(2)) if match.group(2) else lo
        ranges.append((min(lo, hi), max(lo, hi)))
    return tuple(ranges)


def stale_window(steps: int, k: int) -> range:
    """Steps a reply made when ``steps`` outputs existed may mark stale: the last full chunk."""
    end = k * (steps // k)
    return range(max(0, end - k), end)


def accepted_stale(reply: ProtocolReply, steps: int, k: int) -> frozenset[int]:
    """The stale marks of ``reply`` that fall inside its window; all others are ignored."""
    if not reply.stale:
        return frozenset()
    window = stale_window(steps, k)
    return frozenset(s for lo, hi in reply.stale for s in window if lo <= s <= hi)


def ask_text(step: int) -> str:
    """The protocol asked for at the end of one output, when the system prompt does not ask
    (fold mode "auto"). It stays only if the model's next reply follows it."""
    return (
        f"[context protocol: this output is step {step}; later outputs are labelled "
        "[step N]. Start your replies with two lines, `PROGRESS: <one line: what you learned "
        "or did>` and `STALE: <steps you will not need to read again, e.g. 4, 6-8, or ->`, "
        "and stale steps will be folded into a note of your PROGRESS lines; any of them can "
        "be restored verbatim.]"
    )


def reminder_text(misses: int) -> str:
    """The reminder for the ``misses``-th consecutive reply without the protocol lines."""
    lines = "`PROGRESS: <one line>` and `STALE: <steps or ->`"
    if misses <= 1:
        return f"[reminder: start your next reply with the two lines {lines}.]"
    if misses == 2:
        return (
            f"[reminder, 2nd time in a row: your last two replies did not start with {lines}. "
            "Begin your next reply with them.]"
        )
    return (
        f"[IMPORTANT: {misses} replies in a row without the protocol lines. Your next reply "
        f"MUST begin with {lines} before anything else; use `STALE: -` if nothing is stale.]"
    )


def fold_note(first: int, last: int, progress: list[str | None]) -> str:
    """One line standing for folded steps ``first..last``: their PROGRESS lines in order.

    Consecutive identical summaries (parallel calls answered by one reply) appear once.
    """
    summaries: list[str] = []
    for line in progress:
        text = line or "(no PROGRESS line)"
        if not summaries or summaries[-1] != text:
            summaries.append(text)
    body = " · ".join(summaries)
    if first == last:
        return f"step {first} folded: {body} — restore {first} to see it again"
    return f"steps {first}-{last} folded: {body} — restore {first}-{last} to see them again"


def fold_pointer(first: int) -> str:
    """What the other outputs of a folded run say: the note is at the run's first step."""
    return f"folded, see the note at step {first}"
