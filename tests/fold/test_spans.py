from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.fold.calls import (
    FileView,
    path_from_call,
    path_from_command,
    view_from_call,
    view_from_command,
)
from gateway.fold.dedup import (
    MIN_RUN_CHARS,
    MIN_RUN_LINES,
    MIN_SPAN_CHARS,
    DedupIndex,
    dedup_output,
)
from gateway.fold.spans import split_spans
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


CODE = source_lines(80, "mod")  # ~55 characters a line: 6 lines pass MIN_RUN_CHARS


def window(first: int, last: int) -> str:
    """File lines first..last (1-based) without numbers, as `sed -n 'first,lastp'` prints."""
    return "\n".join(CODE[first - 1 : last])


def minisweagent(text: str, code: int = 0) -> str:
    return f"<returncode>{code}</returncode>\n<output>\n{text}\n</output>"


@pytest.mark.parametrize(
    ("command", "view"),
    [
        ("sed -n '252,350p' /testbed/x.py", FileView("/testbed/x.py", 252, 99)),
        ("cd /testbed && sed -n 5,9p ./x.py", FileView("x.py", 5, 5)),
        ("head -n 50 a.py", FileView("a.py", 1, 50)),
        ("head -20 a.py", FileView("a.py", 1, 20)),
        ("THOUGHT: look\n```bash\ncat src/a.py\n```", FileView("src/a.py", 1, None)),
        ("cat -n a.py", None),
        ("cat a.py | grep x", None),
        ("ls; cat a.py", None),
        ("cat a.py b.py", None),
        ("head -n -5 a.py", None),
        ("sed -n '9,5p' a.py", None),
        ("grep -A 50 'def f' a.py", None),
    ],
)
def test_unnumbered_views_a_command_prints(command: str, view: FileView | None) -> None:
    assert view_from_command(command) == view


def test_view_of_a_call_reads_the_shell_command() -> None:
    args = json.dumps({"command": "sed -n '10,20p' src/app.py"})
    assert view_from_call("bash", args) == FileView("src/app.py", 10, 11)
    assert view_from_call("Read", json.dumps({"file_path": "/p/x.py", "offset": 5})) is None


def test_overlapping_windows_stub_the_lines_shown_before_with_their_file_lines() -> None:
    index = DedupIndex()
    first = minisweagent(window(1, 40))
    assert dedup_output(first, 3, index, None, FileView("src/mod.py", 1, 40)) == (first, 0)
    text, count = dedup_output(minisweagent(window(21, 60)), 7, index)
    assert count == 1
    assert text == minisweagent(
        "[lines 3-22: same as step 3 lines 23-42 (src/mod.py lines 21-40) "
        "— restore 7 to see them]\n" + window(41, 60)
    )


def test_without_a_known_view_the_stub_names_the_output_lines() -> None:
    index = DedupIndex()
    dedup_output("$ grep -A 30 'def mod_function_10'\n" + window(11, 41), 0, index)
    text, count = dedup_output("header\n" + window(15, 24) + "\nfooter", 1, index)
    assert count == 1
    assert text == (
        "header\n[lines 2-11: same as step 0 lines 6-15 — restore 1 to see them]\nfooter"
    )


def test_a_failed_command_is_not_taken_for_the_file() -> None:
    index = DedupIndex()
    dedup_output(minisweagent(window(1, 20), code=1), 0, index, None, FileView("a.py", 1, 20))
    text, _ = dedup_output(window(5, 15), 1, index)
    assert text.startswith("[lines 1-11: same as step 0 lines 7-17 —")


def test_runs_below_the_thresholds_stay() -> None:
    index = DedupIndex()
    dedup_output(window(1, 40), 0, index)
    four = window(3, 6)  # fewer than MIN_RUN_LINES
    assert MIN_RUN_LINES > 4 and dedup_output("new\n" + four + "\nend", 1, index)[1] == 0
    short = "\n".join(f"line {i}" for i in range(12))  # 12 lines, under MIN_RUN_CHARS
    dedup_output(short, 2, index)
    assert len(short) < MIN_RUN_CHARS and MIN_RUN_LINES <= 12
    assert dedup_output("x\n" + short, 3, index)[1] == 0


def test_a_run_never_spans_a_stub_of_its_source() -> None:
    index = DedupIndex()
    dedup_output(window(1, 20), 0, index)
    # step 1 shows lines 21-40 but stubs 11-20 (shown by step 0)
    text, count = dedup_output(window(11, 40), 1, index)
    assert count == 1 and text.startswith("[lines 1-10: same as step 0 lines 11-20")
    # 15-40 again: 15-20 come from step 0, 21-40 from step 1; no run crosses the stub
    text, count = dedup_output(window(15, 40), 2, index)
    assert count == 2
    assert text.split("\n") == [
        "[lines 1-6: same as step 0 lines 15-20 — restore 2 to see them]",
        "[lines 7-26: same as step 1 lines 11-30 — restore 2 to see them]",
    ]


def test_a_span_a_run_cut_into_is_not_named_as_shown_later() -> None:
    index = DedupIndex()
    dedup_output(numbered(1, CODE[:20]), 0, index, "src/mod.py")
    dedup_output(numbered(10, CODE[9:40]), 1, index, "src/mod.py")  # 10-20 become a run stub
    text, _ = dedup_output("again\n" + numbered(10, CODE[9:40]), 2, index, "src/mod.py")
    assert "[duplicate of step 1" not in text
    assert text.split("\n")[1:] == [
        "[lines 2-12: same as step 0 lines 10-20 (src/mod.py lines 10-20) — restore 2 to see them]",
        "[lines 13-32: same as step 1 lines 12-31 (src/mod.py lines 21-40) "
        "— restore 2 to see them]",
    ]


def test_long_runs_keep_top_level_signatures() -> None:
    index = DedupIndex()
    dedup_output(window(1, 80), 0, index)
    text, count = dedup_output("rerun\n" + window(1, 45), 1, index)
    lines = text.split("\n")
    assert count == 1
    assert lines[1] == (
        "[lines 2-46: same as step 0 lines 1-45; 5 top-level definitions kept "
        "below — restore 1 to see them]"
    )
    assert lines[2:] == [line for line in CODE[:45] if line.startswith("def ")]


def test_spans_a_same_output_stub_points_at_stay_whole() -> None:
    hits = [f"src/mod.py:{i + 1}:{code}" for i, code in enumerate(CODE[:9])]
    index = DedupIndex()
    dedup_output("\n".join(hits), 0, index)  # shows the lines of the 8-hit group below
    group = "\n".join(hits[:8])
    text, count = dedup_output(group + "\n--\n" + group, 1, index)
    # the first group is a run of step 0, but the second group's stub points at it
    assert (text, count) == (
        group + "\n--\n[duplicate of step 1: search results in src/mod.py (8 lines) "
        "— restore 1 to see it again]",
        1,
    )
    text, count = dedup_output("x\n" + group, 2, index)
    assert count == 1 and text.startswith("x\n[duplicate of step 1: search results")


def test_an_output_shown_with_stubs_is_not_named_as_a_whole_later() -> None:
    index = DedupIndex()
    dedup_output(window(1, 20), 0, index)
    partly = window(11, 40)
    dedup_output(partly, 1, index)  # 11-20 stubbed: step 1 does not show all of it
    text, count = dedup_output(partly, 2, index)
    assert count == 2 and "entire output" not in text


@pytest.mark.parametrize("style", ["tab", "arrow", "colon", "pipe"])
def test_long_runs_of_numbered_lines_keep_signatures_with_their_numbers(style: str) -> None:
    index = DedupIndex()
    view = numbered(1, CODE[:40], style)
    dedup_output("[File: m.py (80 lines total)]\n" + view, 0, index)
    text, count = dedup_output("again\n" + view, 1, index)
    signatures = [line for line in view.split("\n") if "def mod_function" in line]
    assert count == 1 and text.split("\n")[2:] == signatures and len(signatures) == 4
