"""ReFold's deduplication: split a tool output into spans, stub the ones shown before.

A span is a piece of one output that can repeat elsewhere verbatim: the whole output, a
file line range from a file-view tool, or the ``path:line:text`` hits of one file in a
search. ``dedup_output`` walks the spans of one compressed step in order and replaces a
span by a one-line stub when

- its text is an exact duplicate of a span already shown (an earlier step, or earlier in
  the same output; 64-bit digests, confirmed by comparing the texts), or
- it is a file range whose numbered lines (number and text, both exact) all lie inside one
  range of the same file shown before.

Then, in what is left, every maximal run of lines that an earlier step shows contiguously
and byte for byte becomes a stub naming that step's lines (and the file lines, when that
step showed a known file: a numbered range, or an unnumbered ``sed -n``/``head``/``cat``
view whose call is known). Agents mostly re-read overlapping windows of the same files
without line numbers, which whole-span matching never catches. The index keys every
``SHINGLE`` consecutive shown lines, so finding runs costs time linear in the new output.

The first copy always stays; only shown content enters the index (a span or output only
while it is shown whole, lines only while not under a stub), so every stub names a step
whose rendering holds the content. Spans shorter than ``MIN_SPAN_CHARS`` are never
stubbed: a stub line costs ~100 characters, and below ~150 the saving is too small to be
worth breaking the output's flow (and a stub must always be shorter than what it replaces).
Line runs need ``MIN_RUN_LINES`` lines and ``MIN_RUN_CHARS`` characters, for the same reason.
"""

from __future__ import annotations

import bisect
import itertools
import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

import xxhash

MIN_SPAN_CHARS = 150
# A stub eliding more lines than this keeps the top-level class/def lines of the content.
LONG_STUB_LINES = 30
MAX_SIGNATURES = 12

# Repeated line runs are stubbed from MIN_RUN_LINES lines and MIN_RUN_CHARS characters: a
# stub line costs ~100 characters, so a run must be about twice that to be worth one, and 5
# lines is the window the duplicate limit (shared/tools/dedup_limit.py) is measured with.
# Stubs are made when an output arrives and never rewrite the cached prefix, so the only
# cost of a stub is its own line (when stubs were made at boundary moves, each one also
# re-prefilled the context after it and higher thresholds were cheaper). SHINGLE
# consecutive lines key the index; a run is found through any of its shingles.
MIN_RUN_LINES = 5
MIN_RUN_CHARS = 200
SHINGLE = 4

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
# A command that prints (part of) one file as is, alone on its line or after `cd dir &&`:
# the printed lines are then known file lines. Anything piped or chained around it is not.
_VIEW_COMMAND = re.compile(
    r"^[ \t]*(?:cd\s+[^\s;&|]+\s*&&\s*)?"
    r"(?:sed\s+-n\s+(['\"]?)(\d+),(\d+)p\1|head\s+(?:-n\s*|-)(\d+)|cat)"
    r"\s+([^\s|;&<>'\"`$()*?-][^\s|;&<>'\"`$()*?]*)[ \t]*$",
    re.MULTILINE,
)
# SWE-agent's prompt lines after every output; never file lines.
_FOOTER = ("(Open file:", "(Current directory:", "bash-$")


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


@dataclass(frozen=True, slots=True)
class FileView:
    """An unnumbered view of ``path`` that a call printed: its content lines are file lines
    ``first_line``, ``first_line + 1``, ... (at most ``line_count`` of them, if known)."""

    path: str
    first_line: int = 1
    line_count: int | None = None


# (first output line, end output line, path, file line number of the first)
_Place = tuple[int, int, str, int]


@dataclass(frozen=True, slots=True)
class _Shown:
    """A stretch of consecutive lines a compressed step shows verbatim."""

    step: int
    first: int  # index of lines[0] among the step's output lines
    lines: list[str]
    places: tuple[_Place, ...]  # where the step's output holds known file lines


@dataclass(slots=True)
class DedupIndex:
    """What the compressed steps so far have shown, to find duplicates in the next ones."""

    # digest -> (step, the text holding the first copy, start, end)
    exact: dict[int, tuple[int, str, int, int]] = field(default_factory=dict)
    # path -> shown ranges (step, first line number, code lines), oldest first
    ranges: dict[str, list[tuple[int, int, tuple[str, ...]]]] = field(default_factory=dict)
    # SHINGLE consecutive shown lines -> (slot in ``shown``, offset there); first copy wins.
    # Keyed by the lines themselves: exact, and no per-line hashing in Python.
    shingles: dict[tuple[str, ...], tuple[int, int]] = field(default_factory=dict)
    shown: list[_Shown] = field(default_factory=list)
    # How a stub names a step the model cannot find by a ``[step N]`` label: the call that
    # produced it (``step 4 (`cat setup.py`)``). Steps without an entry are named "step N".
    names: dict[int, str] = field(default_factory=dict)
    # Whether stubs say how to restore: only when the model has a way to (the restore tool
    # or the text action), else the first copy, which is always shown, is the way back.
    restore_hint: bool = True
    # Steps some stub names: their content must stay shown (ReFold never folds them).
    sources: set[int] = field(default_factory=set)
    # Steps no longer shown (folded): later stubs must not name them.
    hidden: set[int] = field(default_factory=set)


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
    args, command = _call_arguments(arguments)
    for key in ("file_path", "path"):
        value = args.get(key)
        if isinstance(value, str) and value:
            return normalize_path(value)
    return path_from_command(command) if command else None


def path_from_command(command: str) -> str | None:
    """The single file a shell command prints with line numbers (``cat -n``/``nl``)."""
    found = {normalize_path(m.group(1)) for m in _NUMBERING_COMMAND.finditer(command)}
    return found.pop() if len(found) == 1 else None


def view_from_call(name: str, arguments: str) -> FileView | None:
    """The file lines a shell call prints without numbers, if it clearly does."""
    _, command = _call_arguments(arguments)
    return view_from_command(command) if command else None


def view_from_command(command: str) -> FileView | None:
    """``sed -n 'a,bp' f``, ``head -n N f`` or ``cat f`` as the command's only output."""
    found = list(_VIEW_COMMAND.finditer(command))
    if len(found) != 1:
        return None
    _, first, last, head, path = found[0].groups()
    if first is not None:
        lo, hi = int(first), int(last)
        return FileView(normalize_path(path), lo, hi - lo + 1) if 1 <= lo <= hi else None
    return FileView(normalize_path(path), 1, int(head) if head is not None else None)


def _call_arguments(arguments: str) -> tuple[dict[str, Any], str | None]:
    """A call's JSON arguments and its shell command; non-JSON text is taken as a command."""
    try:
        args = json.loads(arguments)
    except ValueError:
        return {}, arguments
    if not isinstance(args, dict):
        return {}, None
    command = args.get("command") or args.get("cmd")
    if isinstance(command, list):
        command = " ".join(str(c) for c in command)
    return args, command if isinstance(command, str) else None


def describe_producer(producer: Any) -> str | None:
    """A short, one-line name of the call that produced an output, for the model to find it
    by: the shell command, ``Tool path``, or the tool's name; for text actions (a reply),
    the first line of its last code block, else its last line."""
    if producer is None:
        return None
    if isinstance(producer, str):
        blocks = re.findall(r"```[^\n]*\n(.*?)```", producer, re.DOTALL)
        lines = [line.strip() for line in (blocks[-1] if blocks else producer).split("\n")]
        lines = [line for line in lines if line]
        if not lines:
            return None
        text = lines[0] if blocks else lines[-1]
    else:
        args, command = _call_arguments(producer.arguments)
        path = args.get("file_path") or args.get("path")
        text = command or (f"{producer.name} {path}" if isinstance(path, str) else producer.name)
    # Long enough to tell calls apart, short because every stub naming the step repeats it.
    text = " ".join(text.split())
    return text if len(text) <= 48 else text[:45] + "..."


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
    text: str,
    step: int,
    index: DedupIndex,
    path_hint: str | None = None,
    view: FileView | None = None,
) -> tuple[str, int]:
    """``text`` with duplicate spans and repeated line runs stubbed, and the number of stubs;
    updates ``index`` with what stays shown. ``view``: the unnumbered file view the producing
    call printed (see ``view_from_call``), used to name file lines in stubs."""
    spans = split_spans(text, path_hint)
    whole = spans[0]
    whole_digest = digest(text)
    first = _exact_copy(index, whole_digest, text)
    if first is not None and len(text) >= MIN_SPAN_CHARS:
        files = [s for s in spans if s.kind == "file"]
        stub = _stub(index, first, text, whole, files[0] if len(files) == 1 else None)
        if len(stub) < len(text):
            index.sources.add(first)
            return stub, 1
    lines = text.split("\n")
    starts = list(itertools.accumulate((len(line) + 1 for line in lines[:-1]), initial=0))
    # 1. Spans shown before, by an earlier step or earlier in this output.
    stubs: dict[int, tuple[int, str]] = {}  # first line -> (end line, stub)
    kept: list[tuple[Span, int, int]] = []  # (span, first line, end line)
    here = DedupIndex()  # this output's kept spans, so later spans can point at them
    self_stub = False
    for span in spans[1:]:
        body = text[span.start : span.end]
        source = _source_of(index, span, body)
        if source is None:
            source = _source_of(here, span, body)
        lo = bisect.bisect_right(starts, span.start) - 1
        hi = bisect.bisect_right(starts, span.end)
        stub = _stub(index, source, body, span) if source is not None else None
        if stub is not None and len(stub) < len(body):
            stubs[lo] = (hi, stub)
            index.sources.add(source)  # type: ignore[arg-type]
            self_stub = self_stub or source == step
            continue
        kept.append((span, lo, hi))
        _remember_span(here, step, text, span)
    # 2. Runs of lines an earlier step shows. Spans that a stub above points at stay whole.
    blocked = bytearray(len(lines))
    for lo, (hi, _) in stubs.items():
        blocked[lo:hi] = b"\1" * (hi - lo)
    if self_stub:
        for _, lo, hi in kept:
            blocked[lo:hi] = b"\1" * (hi - lo)
    runs = _find_runs(lines, blocked, index, step)
    if self_stub:  # shown after all: their lines go into the index below
        for _, lo, hi in kept:
            blocked[lo:hi] = bytes(hi - lo)
    for lo, hi, stub in runs:
        stubs[lo] = (hi, stub)
        blocked[lo:hi] = b"\2" * (hi - lo)
    # 3. Index what stays shown: spans no run cut into, the output if nothing was stubbed,
    # and its visible lines.
    for span, lo, hi in kept:
        if b"\2" not in blocked[lo:hi]:
            _remember_span(index, step, text, span)
    if not stubs:
        index.exact.setdefault(whole_digest, (step, text, 0, len(text)))
    _remember_lines(index, step, lines, blocked, _places(lines, starts, spans, view))
    if not stubs:
        return text, 0
    out: list[str] = []
    i = 0
    while i < len(lines):
        if i in stubs:
            i, stub = stubs[i]
            out.append(stub)
        else:
            out.append(lines[i])
            i += 1
    return "\n".join(out), len(stubs)


def _remember_span(index: DedupIndex, step: int, text: str, span: Span) -> None:
    index.exact.setdefault(digest(text[span.start : span.end]), (step, text, span.start, span.end))
    if span.kind == "file" and span.path:
        index.ranges.setdefault(span.path, []).append((step, span.first_line, span.codes))


def _exact_copy(index: DedupIndex, key: int, body: str) -> int | None:
    entry = index.exact.get(key)
    if entry is None:
        return None
    step, source, start, end = entry
    return step if source[start:end] == body and step not in index.hidden else None


def _source_of(index: DedupIndex, span: Span, body: str) -> int | None:
    """The step that already shows this span, if stubbing it pays; else None."""
    if len(body) < MIN_SPAN_CHARS:
        return None
    step = _exact_copy(index, digest(body), body)
    if step is not None or span.kind != "file" or not span.path:
        return step
    for shown_step, first, codes in reversed(index.ranges.get(span.path, ())):
        if shown_step in index.hidden:
            continue
        lo = span.first_line - first
        if lo >= 0 and codes[lo : lo + len(span.codes)] == span.codes:
            return shown_step
    return None


def step_name(index: DedupIndex, step: int) -> str:
    return index.names.get(step) or f"step {step}"


def _stub(
    index: DedupIndex, source: int, body: str, span: Span, file_span: Span | None = None
) -> str:
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
    restore = f" — restore {source} to see it again" if index.restore_hint else ""
    head = f"[duplicate of {step_name(index, source)}: {what}{kept}{restore}]"
    return "\n".join([head, *signatures])


def _signatures(body: str, span: Span) -> list[str]:
    """The original lines whose code starts a top-level ``class``/``def``."""
    lines = body.split("\n")
    codes = span.codes if span.kind == "file" else lines
    found = [line for line, code in zip(lines, codes, strict=False) if _SIGNATURE.match(code)]
    return found[:MAX_SIGNATURES]


# -- repeated line runs --------------------------------------------------------------------


def _find_runs(
    lines: list[str], blocked: bytearray, index: DedupIndex, step: int
) -> list[tuple[int, int, str]]:
    """(first line, end line, stub) of each maximal run of free lines that an earlier step
    shows contiguously and that is worth a stub. Greedy, left to right: a shingle hit is
    extended both ways, then the scan resumes after it. Backwards it never goes below the
    previous hit, so each line is looked up once and compared a bounded number of times:
    the cost is linear in the output's size."""
    runs: list[tuple[int, int, str]] = []
    shingles, shown = index.shingles, index.shown
    if not shingles:
        return runs
    for lo, hi in _free_stretches(blocked):
        i = floor = lo
        while i + SHINGLE <= hi:
            hit = shingles.get(tuple(lines[i : i + SHINGLE]))
            if hit is None:
                i += 1
                continue
            source = shown[hit[0]]
            if source.step in index.hidden:
                i += 1
                continue
            offset, theirs = hit[1], source.lines
            end = i + SHINGLE
            limit = min(hi, i + len(theirs) - offset)
            while end < limit and theirs[offset + end - i] == lines[end]:
                end += 1
            start = i
            while start > floor and offset > 0 and theirs[offset - 1] == lines[start - 1]:
                start, offset = start - 1, offset - 1
            stub = _run_stub(index, lines, start, end, source, offset, step)
            if stub is None:
                floor, i = i + 1, max(i + 1, end - SHINGLE + 1)
                continue
            runs.append((start, end, stub))
            index.sources.add(source.step)
            i = floor = end
    return runs


def _run_stub(
    index: DedupIndex,
    lines: list[str],
    start: int,
    end: int,
    source: _Shown,
    offset: int,
    step: int,
) -> str | None:
    """The stub for ``lines[start:end]``, shown by ``source`` from its line ``offset``;
    None when the run is too small or the stub would not be shorter."""
    count = end - start
    if count < MIN_RUN_LINES:
        return None
    size = sum(map(len, lines[start:end])) + count - 1
    if size < MIN_RUN_CHARS:
        return None
    first = source.first + offset  # 0-based line of the copy in the source step's output
    where = f"{step_name(index, source.step)} lines {first + 1}-{first + count}"
    for lo, hi, path, file_line in source.places:
        if lo <= first and first + count <= hi:
            line = file_line + first - lo
            where += f" ({path} lines {line}-{line + count - 1})"
            break
    signatures = []
    if count > LONG_STUB_LINES:
        run = lines[start:end]
        signatures = [line for line in run if _SIGNATURE.match(_code(line))][:MAX_SIGNATURES]
    kept = f"; {len(signatures)} top-level definitions kept below" if signatures else ""
    restore = f" — restore {step} to see them" if index.restore_hint else ""
    head = f"[lines {start + 1}-{end}: same as {where}{kept}{restore}]"
    stub = "\n".join([head, *signatures])
    return stub if len(stub) < size else None


def _code(line: str) -> str:
    """A line without its file-view line number, if it has one."""
    if m := _TAB_LINE.fullmatch(line) or _ARROW_LINE.fullmatch(line):
        return m.group(2)
    return m.group(3) if (m := _WINDOW_LINE.fullmatch(line)) else line


def _remember_lines(
    index: DedupIndex, step: int, lines: list[str], blocked: bytearray, places: tuple[_Place, ...]
) -> None:
    """Index every shingle of each stretch of lines this step shows verbatim (first copy
    wins). Stretches too short to hold a stubbable run are skipped."""
    setdefault = index.shingles.setdefault
    for lo, hi in _free_stretches(blocked):
        if hi - lo < MIN_RUN_LINES:
            continue
        shown = _Shown(step, lo, lines[lo:hi], places)
        slot = len(index.shown)
        index.shown.append(shown)
        for j in range(hi - lo - SHINGLE + 1):
            setdefault(tuple(shown.lines[j : j + SHINGLE]), (slot, j))


_FREE = re.compile(rb"\0+")


def _free_stretches(blocked: bytearray) -> list[tuple[int, int]]:
    """(start, end) of each maximal stretch of lines not taken by a stub."""
    return [m.span() for m in _FREE.finditer(blocked)]


def _places(
    lines: list[str], starts: list[int], spans: list[Span], view: FileView | None
) -> tuple[_Place, ...]:
    """Where this output shows known file lines: numbered file spans with a path, and the
    content of an unnumbered view the call printed."""
    places = []
    for span in spans[1:]:
        if span.kind == "file" and span.path:
            lo = bisect.bisect_right(starts, span.start) - 1
            places.append((lo, lo + span.line_count, span.path, span.first_line))
    if view is not None and (content := _view_content(lines, view)) is not None:
        places.append((*content, view.path, view.first_line))
    return tuple(places)


def _view_content(lines: list[str], view: FileView) -> tuple[int, int] | None:
    """The output lines that hold the viewed file's lines: all of them, or those inside
    mini-swe-agent's ``<returncode>0</returncode><output>…</output>`` wrapper, without
    SWE-agent's prompt footer; no more than the view asked for."""
    lo, hi = 0, len(lines)
    if lines[0].startswith("<returncode>"):
        if lines[0] != "<returncode>0</returncode>" or hi < 3 or lines[1] != "<output>":
            return None  # a failed command, or a truncated output
        lo = 2
        if lines[-1] == "</output>":
            hi -= 1
    while hi > lo and lines[hi - 1].startswith(_FOOTER):
        hi -= 1
    if view.line_count is not None:
        hi = min(hi, lo + view.line_count)
    return lo, hi
