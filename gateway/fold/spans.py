"""ReFold's spans: a tool output split into the pieces that can repeat elsewhere verbatim.

A span is a piece of one output: the whole output, a file line range from a file-view
tool, or the ``path:line:text`` hits of one file in a search (``split_spans``).
``gateway.fold.dedup`` stubs the spans and line runs that earlier steps showed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from gateway.fold.calls import normalize_path

SpanKind = Literal["output", "file", "search"]

# Numbered file-view lines. Tab: `cat -n`, `nl -ba`, OpenHands' editor. Arrow: Claude Code's
# Read. Colon/pipe: SWE-agent `open`/`goto` and OpenHands windows, only under a [File:] header.
_TAB_LINE = re.compile(r" *(\d+)\t(.*)", re.DOTALL)
_ARROW_LINE = re.compile(r" *(\d+)→(.*)", re.DOTALL)
_WINDOW_LINE = re.compile(r"(\d+)([:|])(.*)", re.DOTALL)
_FILE_HEADER = re.compile(r"\[File: (.+?) \(\d+ lines total\)\]\s*$")
_CAT_N_HEADER = re.compile(r"Here's the result of running `cat -n` on (.+?):\s*$")
_EDITED_FILE = re.compile(r"The file (\S+) has been (?:updated|edited)")
# grep -n / ripgrep hits; the path must look like one (has a dot or slash, not all digits),
# so that timestamps such as "15:18:53" are not taken for search results. Up to its first
# dot or slash, then the rest, each possessive: linear in a line of slashes.
_GREP_LINE = re.compile(r"([^\s:./]*+[./][^\s:]*+):(\d+):(.*)", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Span:
    """A piece of one output: ``text[start:end]``. File spans know their numbered lines."""

    start: int
    end: int
    kind: SpanKind
    path: str | None = None
    first_line: int = 0
    last_line: int = 0
    # For file spans: the code text of each line (number prefix removed), in order.
    codes: tuple[str, ...] = ()
    line_count: int = 0


def split_spans(text: str, path_hint: str | None = None) -> list[Span]:
    """The spans of one output: the whole output first, then file ranges and search groups.

    ``path_hint`` is the file the producing call displayed (see ``path_from_call``); a
    ``[File: ...]`` or ``cat -n`` header inside the output names the file of the lines below.
    """
    spans = [Span(0, len(text), "output", line_count=text.count("\n") + 1)]
    path = path_hint
    window = False  # under a [File:] header: "12:code" / "12|code" lines are file lines
    run: _Run | None = None
    offset = 0
    # The first edit notice of the output, searched once: the one a header below it names
    # (the first in ``text[:end]`` is the first in ``text`` when it ends by ``end``).
    edited = _EDITED_FILE.search(text)
    for line in text.split("\n"):
        end = offset + len(line)
        header = _FILE_HEADER.match(line)
        # Only a line ending in a colon can be one: a search from every "Here's ..." of a
        # line that is not would scan the rest of the line from each.
        ends_colon = line.rstrip().endswith(":")
        cat_header = None if header or not ends_colon else _CAT_N_HEADER.search(line)
        item = None if header or cat_header else _classify(line, window)
        if header:
            path, window = normalize_path(header.group(1)), True
        elif cat_header:
            notice = edited if edited is not None and edited.end() <= end else None
            path = _cat_n_path(cat_header.group(1), notice) or path_hint
        if item is not None and run is not None and run.continues(item[0], item[1], item[2]):
            run.add(end, item[2], item[3])
        else:
            _close(run, spans)
            run = None if item is None else _Run(item, path, offset, end)
        offset = end + 1
    _close(run, spans)
    return spans


def _cat_n_path(named: str, edited: re.Match[str] | None) -> str | None:
    if "edited file" in named:
        return normalize_path(edited.group(1)) if edited else None
    return normalize_path(named)


def _classify(line: str, window: bool) -> tuple[str, str, int, str] | None:
    """(style, search path or "", line number, code) for a numbered or search line."""
    if m := _TAB_LINE.fullmatch(line):
        return "tab", "", int(m.group(1)), m.group(2)
    if m := _ARROW_LINE.fullmatch(line):
        return "arrow", "", int(m.group(1)), m.group(2)
    if window and (m := _WINDOW_LINE.fullmatch(line)):
        return "window" + m.group(2), "", int(m.group(1)), m.group(3)
    if (m := _GREP_LINE.fullmatch(line)) and not m.group(1).replace(".", "").isdigit():
        return "search", normalize_path(m.group(1)), int(m.group(2)), m.group(3)
    return None


class _Run:
    """Consecutive lines of one style being gathered into a span."""

    __slots__ = ("codes", "end", "first", "key", "last", "path", "start", "style")

    def __init__(self, item: tuple[str, str, int, str], path: str | None, start: int, end: int):
        self.style, self.key, self.first, code = item
        self.last = self.first
        self.codes = [code]
        self.path, self.start, self.end = path, start, end

    def continues(self, style: str, key: str, number: int) -> bool:
        if style != self.style or key != self.key:
            return False
        # File lines must be consecutive; the hits of one file in a search just keep coming.
        return style == "search" or number == self.last + 1

    def add(self, end: int, number: int, code: str) -> None:
        self.end, self.last = end, number
        self.codes.append(code)


def _close(run: _Run | None, spans: list[Span]) -> None:
    if run is None:
        return
    if run.style == "search":
        spans.append(Span(run.start, run.end, "search", run.key, line_count=len(run.codes)))
    else:
        codes = tuple(run.codes)
        spans.append(
            Span(run.start, run.end, "file", run.path, run.first, run.last, codes, len(codes))
        )


def line_code(line: str) -> str:
    """A line without its file-view line number, if it has one."""
    if not line.lstrip(" ")[:1].isdecimal():
        return line  # every number prefix starts with a decimal digit (`\d`)
    if m := _TAB_LINE.fullmatch(line) or _ARROW_LINE.fullmatch(line):
        return m.group(2)
    return m.group(3) if (m := _WINDOW_LINE.fullmatch(line)) else line
