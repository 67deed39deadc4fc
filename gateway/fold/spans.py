"""ReFold's deduplication: split a tool output into spans, stub the ones shown before.

A span is a piece of one output that can repeat elsewhere verbatim: the whole output, a
file line range from a file-view tool, or the ``path:line:text`` hits of one file in a
search. ``dedup_output`` walks the spans of one compressed step in order and replaces a
span by a one-line stub when

- its text is an exact duplicate of a span already shown (an earlier step, or earlier in
  the same output; 64-bit digests, confirmed by comparing the texts), or
- it is a file range whose numbered lines (number and text, both exact) all lie inside one
  range of the same file shown before.

The first copy always stays; only shown content enters the index, so every stub names a
step whose rendering holds the content. Spans shorter than ``MIN_SPAN_CHARS`` are never
stubbed: a stub line costs ~100 characters, and below ~200 the saving is too small to be
worth breaking the output's flow (and a stub must always be shorter than what it replaces).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Literal

import xxhash

MIN_SPAN_CHARS = 200
# A stub eliding more lines than this keeps the top-level class/def lines of the content.
LONG_STUB_LINES = 30
MAX_SIGNATURES = 12

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
# so that timestamps such as "15:18:53" are not taken for search results.
_GREP_LINE = re.compile(r"([^\s:]*[./][^\s:]*):(\d+):(.*)", re.DOTALL)
_SIGNATURE = re.compile(r"(?:async\s+def|def|class)\s")
# A command that prints one file with its own line numbers (so numbers are file lines).
_NUMBERING_COMMAND = re.compile(
    r"(?:^|[\s;&|(])(?:cat\s+(?:-\w+\s+)*-\w*n\w*|nl(?:\s+-\w+)*)\s+(?:--\s+)?"
    r"([^\s|;&<>'\"`$()]+)\s*(?:$|[|;&)])",
    re.MULTILINE,
)


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


@dataclass(slots=True)
class DedupIndex:
    """What the compressed steps so far have shown, to find duplicates in the next ones."""

    # digest -> (step, the text holding the first copy, start, end)
    exact: dict[int, tuple[int, str, int, int]] = field(default_factory=dict)
    # path -> shown ranges (step, first line number, code lines), oldest first
    ranges: dict[str, list[tuple[int, int, tuple[str, ...]]]] = field(default_factory=dict)


def normalize_path(path: str) -> str:
    path = path.strip().strip("'\"")
    while path.startswith("./"):
        path = path[2:]
    return path


def path_from_call(name: str, arguments: str) -> str | None:
    """The file a tool call displays with its own line numbers, if it clearly does.

    ``file_path``/``path`` arguments (Claude Code Read, OpenHands/SWE-agent editors) or a
    shell command that numbers one file (``cat -n f``, ``nl -ba f | sed -n 5,9p``).
    """
    try:
        args = json.loads(arguments)
    except ValueError:
        return path_from_command(arguments)
    if not isinstance(args, dict):
        return None
    for key in ("file_path", "path"):
        value = args.get(key)
        if isinstance(value, str) and value:
            return normalize_path(value)
    command = args.get("command") or args.get("cmd")
    if isinstance(command, list):
        command = " ".join(str(c) for c in command)
    return path_from_command(command) if isinstance(command, str) else None


def path_from_command(command: str) -> str | None:
    """The single file a shell command prints with line numbers (``cat -n``/``nl``)."""
    found = {normalize_path(m.group(1)) for m in _NUMBERING_COMMAND.finditer(command)}
    return found.pop() if len(found) == 1 else None


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
    for line in text.split("\n"):
        end = offset + len(line)
        header = _FILE_HEADER.match(line)
        cat_header = None if header else _CAT_N_HEADER.search(line)
        item = None if header or cat_header else _classify(line, window)
        if header:
            path, window = normalize_path(header.group(1)), True
        elif cat_header:
            path = _cat_n_path(cat_header.group(1), text[:end]) or path_hint
        if item is not None and run is not None and run.continues(item[0], item[1], item[2]):
            run.add(end, item[2], item[3])
        else:
            _close(run, spans)
            run = None if item is None else _Run(item, path, offset, end)
        offset = end + 1
    _close(run, spans)
    return spans


def _cat_n_path(named: str, before: str) -> str | None:
    if "edited file" in named:
        edited = _EDITED_FILE.search(before)
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


def digest(text: str) -> int:
    return xxhash.xxh3_64_intdigest(text.encode("utf-8", "surrogatepass"))


def dedup_output(
    text: str, step: int, index: DedupIndex, path_hint: str | None = None
) -> tuple[str, int]:
    """``text`` with duplicate spans stubbed, and the number of stubs; updates ``index``."""
    spans = split_spans(text, path_hint)
    whole = spans[0]
    whole_digest = digest(text)
    first = _exact_copy(index, whole_digest, text)
    if first is not None and len(text) >= MIN_SPAN_CHARS:
        files = [s for s in spans if s.kind == "file"]
        stub = _stub(first, text, whole, files[0] if len(files) == 1 else None)
        if len(stub) < len(text):
            return stub, 1
    pieces: list[str] = []
    stubs = 0
    cursor = 0
    for span in spans[1:]:
        body = text[span.start : span.end]
        source = _source_of(index, span, body)
        stub = _stub(source, body, span) if source is not None else None
        if stub is not None and len(stub) < len(body):
            pieces.append(text[cursor : span.start])
            pieces.append(stub)
            cursor = span.end
            stubs += 1
            continue
        index.exact.setdefault(digest(body), (step, text, span.start, span.end))
        if span.kind == "file" and span.path:
            index.ranges.setdefault(span.path, []).append((step, span.first_line, span.codes))
    index.exact.setdefault(whole_digest, (step, text, 0, len(text)))
    if not stubs:
        return text, 0
    pieces.append(text[cursor:])
    return "".join(pieces), stubs


def _exact_copy(index: DedupIndex, key: int, body: str) -> int | None:
    entry = index.exact.get(key)
    if entry is None:
        return None
    step, source, start, end = entry
    return step if source[start:end] == body else None


def _source_of(index: DedupIndex, span: Span, body: str) -> int | None:
    """The step that already shows this span, if stubbing it pays; else None."""
    if len(body) < MIN_SPAN_CHARS:
        return None
    step = _exact_copy(index, digest(body), body)
    if step is not None or span.kind != "file" or not span.path:
        return step
    for shown_step, first, codes in reversed(index.ranges.get(span.path, ())):
        lo = span.first_line - first
        if lo >= 0 and codes[lo : lo + len(span.codes)] == span.codes:
            return shown_step
    return None


def _stub(source: int, body: str, span: Span, file_span: Span | None = None) -> str:
    """One line naming where the content is shown, plus signatures for long content."""
    if span.kind == "file":
        where = f"{span.path} lines" if span.path else "numbered lines"
        what = f"{where} {span.first_line}-{span.last_line}"
    elif span.kind == "search":
        what = f"search results in {span.path} ({span.line_count} lines)"
    elif file_span is not None and file_span.path:
        what = (
            f"this entire output ({file_span.path} lines "
            f"{file_span.first_line}-{file_span.last_line})"
        )
    else:
        what = f"this entire output ({span.line_count} lines)"
    signatures = _signatures(body, span) if span.line_count > LONG_STUB_LINES else []
    kept = f"; {len(signatures)} top-level definitions kept below" if signatures else ""
    head = f"[duplicate of step {source}: {what}{kept} — restore {source} to see it again]"
    return "\n".join([head, *signatures])


def _signatures(body: str, span: Span) -> list[str]:
    """The original lines whose code starts a top-level ``class``/``def``."""
    lines = body.split("\n")
    codes = span.codes if span.kind == "file" else lines
    found = [line for line, code in zip(lines, codes, strict=False) if _SIGNATURE.match(code)]
    return found[:MAX_SIGNATURES]
