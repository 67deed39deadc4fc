"""Whether a later message refers to a step: what keeps a claimed step from being folded.

A message after a claim's point (``FoldClaim.after``) refers to step S when it holds the
agent's or the user's own words (an assistant message: its text, thinking and call
arguments; a user message that is not an observation) and in them

- S's tool-call id, as a word (harnesses name calls by id: background tasks, task
  outputs; ids are words of ``MIN_ID_CHARS`` or more mixing letters and digits);
- a quoted line of S: one of S's output lines (its line number removed, blanks stripped)
  of at least ``QUOTE_CHARS`` characters, as a whole line of the message (an ``Edit``'s
  ``old_string`` quotes the lines it replaces) or as a `code` or "quoted" fragment in it;
- a path S printed that its own call did not name: S is where the agent learnt of it (a
  search hit it then opens, a traceback's file it then edits); paths compare by their last
  two parts.

A line or path that the superseding output (``FoldClaim.fresh``) shows again is no
reference to the stale one: the agent can read it there. Everything is exact string
matching, so the same history always gives the same answer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

from gateway.fold.spans import line_code
from gateway.transcript import Message

QUOTE_CHARS = 24
# Shorter call ids ("c1") could appear in any text; harnesses' ids are longer.
MIN_ID_CHARS = 8
# Words are split at blanks, quotes, brackets and punctuation that does not occur in paths
# (one linear pass); a path has a slash and a file extension: src/app/models.py.
_WORD_BREAK = re.compile(r"[\s'\"`()\[\]{}<>,;:=|&]+")
# A word that may be a call id: a whole run of word characters and dashes, long enough.
_ID_WORD = re.compile(rf"[\w-]{{{MIN_ID_CHARS},}}")
_ASCII_DIGIT = re.compile(r"[0-9]")
_ASCII_LETTER = re.compile(r"[A-Za-z]")
_EXTENSION = re.compile(r"[\w-][\w.-]*\.[A-Za-z]\w*")
# A quoted fragment: between backticks or double quotes on one line; each scan stops at the
# next quote, so the pass is linear.
_FRAGMENT = re.compile(rf"`([^`\n]{{{QUOTE_CHARS},}})`|\"([^\"\n]{{{QUOTE_CHARS},}})\"")


@dataclass(frozen=True, slots=True)
class Said:
    """What one message says, ready to be matched: its quotable lines, its paths and the
    words in it that can be call ids."""

    lines: frozenset[str]
    paths: frozenset[str]
    ids: frozenset[str]


@dataclass(frozen=True, slots=True)
class Anchors:
    """What a later message would quote of one step."""

    lines: frozenset[str]
    paths: frozenset[str]
    call_id: str | None

    def without(self, fresh: Anchors) -> Anchors:
        return Anchors(self.lines - fresh.lines, self.paths - fresh.paths, self.call_id)


def _strings(value: object) -> list[str]:
    """Every string inside a decoded JSON value."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def said(message: Message) -> Said | None:
    """The words of ``message`` (text, thinking, and the strings of its call arguments);
    None when nothing in them can refer to a step (kept per message: most say nothing)."""
    texts = [message.text, message.thinking]
    for call in message.tool_calls:
        try:
            texts.extend(_strings(json.loads(call.arguments)))
        except (ValueError, RecursionError):
            texts.append(call.arguments)
    text = "\n".join(t for t in texts if t)
    lines = {
        s
        for line in text.split("\n")
        if len(line) >= QUOTE_CHARS and len(s := line_code(line).strip()) >= QUOTE_CHARS
    }
    for found in _FRAGMENT.finditer(text):
        lines.add((found.group(1) or found.group(2)).strip())
    ids = frozenset(w for w in _ID_WORD.findall(text) if _mixes_letters_and_digits(w))
    paths = _path_keys(_paths(text))
    if not lines and not paths and not ids:
        return None
    return Said(frozenset(lines), paths, ids)


def _mixes_letters_and_digits(word: str) -> bool:
    """Harnesses' call ids mix letters and digits (``toolu_01A…``, ``call_9x…``), as
    ``str.isdigit`` and ``str.isalpha`` class characters. An ASCII word (nearly every one)
    is searched in C instead of character by character."""
    if word.isascii():
        return bool(_ASCII_DIGIT.search(word)) and bool(_ASCII_LETTER.search(word))
    return any(ch.isdigit() for ch in word) and any(ch.isalpha() for ch in word)


def anchors(output: str, call_arguments: str = "", call_id: str | None = None) -> Anchors:
    """What of ``output`` a later message may quote; paths its call named do not count."""
    # A line's code is a part of it: a line shorter than a quote holds none.
    lines = frozenset(
        s
        for line in output.split("\n")
        if len(line) >= QUOTE_CHARS and len(s := line_code(line).strip()) >= QUOTE_CHARS
    )
    paths = _path_keys(p for p in _paths(output) if p not in call_arguments)
    return Anchors(lines, paths, call_id)


def _paths(text: str) -> list[str]:
    """The words of ``text`` that look like file paths."""
    out: list[str] = []
    if "/" not in text:
        return out
    # A line break is a word break: only the lines with a slash can hold a path.
    for line in text.split("\n"):
        if "/" not in line:
            continue
        for word in _WORD_BREAK.split(line):
            if "/" in word:
                word = word.rstrip(".")
                if _EXTENSION.fullmatch(word.rsplit("/", 1)[1]):
                    out.append(word)
    return out


def _path_keys(paths: Iterable[str]) -> frozenset[str]:
    """A path by its last two parts: ``/testbed/django/db/models/query.py`` in a traceback
    and ``django/db/models/query.py`` in the agent's next command are the same file."""
    return frozenset("/".join(p.rstrip("/").split("/")[-2:]) for p in paths)


def refers(anchor: Anchors, words: Said) -> bool:
    """True when ``words`` quote a line of the step, name a path it printed, or its id."""
    if anchor.call_id and anchor.call_id in words.ids:
        return True
    return not anchor.lines.isdisjoint(words.lines) or not anchor.paths.isdisjoint(words.paths)
