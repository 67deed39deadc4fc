from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.fold.spans import (
    MIN_SPAN_CHARS,
    DedupIndex,
    dedup_output,
    path_from_call,
    path_from_command,
    split_spans,
)
from tests.fold.conftest import numbered, source_lines

LINES = source_lines(40)


def file_spans(text: str, hint: str | None = None) -> list[tuple[str | None, int, int]]:
    return [
        (s.path, s.first_line, s.last_line) for s in split_spans(text, hint) if s.kind == "file"
    ]


@pytest.mark.parametrize("style", ["tab", "arrow"])
def test_cat_n_and_claude_read_lines_are_a_file_range_of_the_called_path(style: str) -> None:
    text = numbered(10, LINES[:5], style)
    spans = split_spans(text, "src/app.py")
    assert spans[0].kind == "output" and (spans[0].start, spans[0].end) == (0, len(text))
    assert file_spans(text, "src/app.py") == [("src/app.py", 10, 14)]
    assert spans[1].codes == tuple(LINES[:5])


def test_swe_agent_open_window_takes_its_path_from_the_header() -> None:
    text = (
        "[File: /repo/setup.py (94 lines total)]\n(3 more lines above)\n"
        + numbered(4, LINES[:6], "colon")
        + "\n(84 more lines below)\n(Open file: /repo/setup.py)\nbash-$"
    )
    assert file_spans(text, None) == [("/repo/setup.py", 4, 9)]


def test_openhands_pipe_window_and_cat_n_header() -> None:
    window = "[File: /workspace/App.css (42 lines total)]\n" + numbered(1, LINES[:3], "pipe")
    assert file_spans(window) == [("/workspace/App.css", 1, 3)]
    view = "Here's the result of running `cat -n` on /workspace/a.py:\n" + numbered(1, LINES[:4])
    assert file_spans(view) == [("/workspace/a.py", 1, 4)]
    edited = (
        "The file /w/b.py has been updated. Here's the result of running `cat -n` on a "
        "snippet of the edited file:\n" + numbered(7, LINES[:2], "arrow")
    )
    assert file_spans(edited) == [("/w/b.py", 7, 8)]


def test_colon_lines_without_a_file_header_are_not_file_lines() -> None:
    assert file_spans("1:import os\n2:import sys") == []


def test_a_gap_in_numbering_starts_a_new_range() -> None:
    text = numbered(1, LINES[:3]) + "\n" + numbered(20, LINES[:2])
    assert file_spans(text, "a.py") == [("a.py", 1, 3), ("a.py", 20, 21)]


def test_search_hits_are_grouped_per_file_and_timestamps_are_not_hits() -> None:
    text = "src/a.py:12:foo()\nsrc/a.py:40:bar()\nlib/b.py:3:baz\n15:18:53 [warning] x"
    groups = [(s.path, s.line_count) for s in split_spans(text) if s.kind == "search"]
    assert groups == [("src/a.py", 2), ("lib/b.py", 1)]


def test_path_of_a_call() -> None:
    assert path_from_call("Read", json.dumps({"file_path": "/p/x.ex"})) == "/p/x.ex"
    assert path_from_call("bash", json.dumps({"command": "cat -n ./src/x.py"})) == "src/x.py"
    assert path_from_call("bash", json.dumps({"command": "nl -ba x.py | sed -n 5,9p"})) == "x.py"
    # sed's own slice renumbered by cat -n: the numbers are not file lines.
    assert path_from_call("bash", json.dumps({"command": "sed -n 5,9p x.py | cat -n"})) is None
    assert path_from_command("cat -n a.py b.py") is None
    assert path_from_call("bash", "not json") is None


def test_whole_output_duplicate_becomes_a_stub_naming_the_first_step() -> None:
    index = DedupIndex()
    output = "\n".join(f"collected test_{i} ... ok" for i in range(20))
    assert dedup_output(output, 2, index) == (output, 0)
    stub, count = dedup_output(output, 5, index)
    assert count == 1
    assert stub == (
        "[duplicate of step 2: this entire output (20 lines) — restore 2 to see it again]"
    )


def test_short_duplicates_are_kept_because_a_stub_would_not_pay() -> None:
    index = DedupIndex()
    short = "x" * (MIN_SPAN_CHARS - 1)
    dedup_output(short, 0, index)
    assert dedup_output(short, 1, index) == (short, 0)


def test_file_range_duplicate_inside_a_different_output_names_path_and_lines() -> None:
    index = DedupIndex()
    view = numbered(10, LINES[:8])
    dedup_output("$ cat -n src/app.py\n" + view + "\nexit 0", 1, index, "src/app.py")
    later = "first run\n" + view + "\nsecond run"
    text, count = dedup_output(later, 4, index, "src/app.py")
    assert count == 1
    assert text == (
        "first run\n[duplicate of step 1: src/app.py lines 10-17 — restore 1 to see it again]"
        "\nsecond run"
    )


def test_a_range_inside_an_earlier_range_of_the_same_file_is_stubbed_across_formats() -> None:
    index = DedupIndex()
    dedup_output(numbered(1, LINES[:30], "arrow"), 0, index, "src/app.py")
    inner = "Here's the result of running `cat -n` on src/app.py:\n" + numbered(5, LINES[4:14])
    text, count = dedup_output(inner, 3, index)
    assert count == 1
    assert text.endswith("[duplicate of step 0: src/app.py lines 5-14 — restore 0 to see it again]")


def test_a_changed_line_or_another_file_is_not_a_file_range_duplicate() -> None:
    index = DedupIndex()
    dedup_output(numbered(1, LINES[:30]), 0, index, "src/app.py")
    edited = LINES[4:24]
    edited[3] = "    value = 'edited'"
    text, _ = dedup_output(numbered(5, edited), 1, index, "src/app.py")
    assert "[duplicate of" not in text and "value = 'edited'" in text
    text, _ = dedup_output(numbered(5, LINES[4:14]), 2, index, "src/other.py")
    assert "[duplicate of" not in text
    # the same lines at other line numbers are another part of the file, and other bytes
    assert dedup_output(numbered(6, LINES[4:14]), 3, index, "src/app.py")[1] == 0


def test_duplicate_earlier_in_the_same_output_is_stubbed() -> None:
    hits = "\n".join(f"src/mod.py:{i}:    handler_{i} = register(event_{i})" for i in range(8))
    text, count = dedup_output(hits + "\n---\n" + hits, 7, DedupIndex())
    assert count == 1
    assert text == (
        hits + "\n---\n[duplicate of step 7: search results in src/mod.py (8 lines) "
        "— restore 7 to see it again]"
    )


def test_long_stubs_keep_top_level_signatures() -> None:
    index = DedupIndex()
    view = numbered(1, LINES[:40])
    dedup_output(view, 0, index, "src/app.py")
    text, count = dedup_output("header\n" + view, 2, index, "src/app.py")
    lines = text.split("\n")
    signature_lines = [line for line in view.split("\n") if "\tdef " in line]
    assert count == 1 and len(signature_lines) == 4
    assert lines[1] == (
        "[duplicate of step 0: src/app.py lines 1-40; 4 top-level definitions kept below "
        "— restore 0 to see it again]"
    )
    assert lines[2:] == signature_lines


@settings(max_examples=200, deadline=None)
@given(
    blocks=st.lists(st.integers(0, 5), min_size=1, max_size=8),
    sizes=st.lists(st.integers(1, 60), min_size=6, max_size=6),
)
def test_a_stub_is_always_shorter_than_what_it_replaces(
    blocks: list[int], sizes: list[int]
) -> None:
    pool = [numbered(1, source_lines(n, f"m{i}")) for i, n in enumerate(sizes)]
    index = DedupIndex()
    for step, b in enumerate(blocks):
        out = "run\n" + pool[b]
        text, _ = dedup_output(out, step, index, f"f{b}.py")
        assert len(text) <= len(out)
