"""ReFold's deduplication: stub the spans of a tool output (``spans.py``) shown before.

``dedup_output`` walks the spans of one compressed step in order and replaces a
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
import re
from dataclasses import dataclass, field

import xxhash

from gateway.fold.calls import FileView
from gateway.fold.spans import Span, line_code, split_spans

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
_SIGNATURE = re.compile(r"(?:async\s+def|def|class)\s")
# SWE-agent's prompt lines after every output; never file lines.
_FOOTER = ("(Open file:", "(Current directory:", "bash-$")

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
        signatures = [line for line in run if _SIGNATURE.match(line_code(line))][:MAX_SIGNATURES]
    kept = f"; {len(signatures)} top-level definitions kept below" if signatures else ""
    restore = f" — restore {step} to see them" if index.restore_hint else ""
    head = f"[lines {start + 1}-{end}: same as {where}{kept}{restore}]"
    stub = "\n".join([head, *signatures])
    return stub if len(stub) < size else None


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
