from __future__ import annotations

import pytest

from gateway.fold.protocol import (
    ProtocolReply,
    accepted_stale,
    fold_note,
    fold_pointer,
    parse_reply,
    parse_stale,
    reminder_text,
    stale_window,
)


@pytest.mark.parametrize(
    "text",
    [
        "PROGRESS: found the bug\nSTALE: 3-5",
        "  progress:   found the bug  \n\nstale : 3-5\nthen more text",
        "**PROGRESS:** found the bug\n**STALE:** 3-5",
        "**Progress**: found the bug\n__Stale__: 3–5",
        "- PROGRESS: found the bug\n- STALE: 3..5",
        "Let me think.\nPROGRESS: found the bug\nSTALE: steps 3 to 5",
    ],
)
def test_protocol_lines_are_read_tolerantly(text: str) -> None:
    assert parse_reply(text) == ProtocolReply("found the bug", ((3, 5),))


def test_missing_lines_are_none_and_make_the_reply_incomplete() -> None:
    assert parse_reply("I will run the tests.") == ProtocolReply(None, None)
    only_progress = parse_reply("PROGRESS: ran tests")
    assert only_progress.progress == "ran tests" and only_progress.stale is None
    assert not only_progress.complete
    assert parse_reply("PROGRESS: x\nSTALE: -").complete


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("-", ()),
        ("none", ()),
        ("", ()),
        ("4", ((4, 4),)),
        ("3, 5-7", ((3, 3), (5, 7))),
        ("7-5", ((5, 7),)),
        ("3 and 4", ((3, 3), (4, 4))),
    ],
)
def test_stale_values(value: str, expected: tuple[tuple[int, int], ...]) -> None:
    assert parse_stale(value) == expected


def test_stale_window_is_the_last_complete_chunk() -> None:
    assert list(stale_window(2, 3)) == []
    assert list(stale_window(3, 3)) == [0, 1, 2]
    assert list(stale_window(5, 3)) == [0, 1, 2]
    assert list(stale_window(6, 3)) == [3, 4, 5]
    assert list(stale_window(8, 2)) == [6, 7]


def test_only_stale_marks_inside_the_window_are_accepted() -> None:
    reply = parse_reply("PROGRESS: p\nSTALE: 1, 3-4, 7, 99999999999")
    assert accepted_stale(reply, 7, 3) == frozenset({3, 4})
    assert accepted_stale(reply, 2, 3) == frozenset()
    assert accepted_stale(parse_reply("PROGRESS: p\nSTALE: -"), 7, 3) == frozenset()
    assert accepted_stale(parse_reply("no lines"), 7, 3) == frozenset()


def test_fold_note_joins_progress_lines_and_says_how_to_restore() -> None:
    assert fold_note(3, 5, ["read a.py", "ran tests", "edited a.py"]) == (
        "steps 3-5 folded: read a.py · ran tests · edited a.py — restore 3-5 to see them again"
    )
    assert fold_note(4, 4, ["read a.py"]) == "step 4 folded: read a.py — restore 4 to see it again"
    # one reply answering parallel calls gives several steps the same summary: shown once
    assert fold_note(0, 2, ["x", "x", None]) == (
        "steps 0-2 folded: x · (no PROGRESS line) — restore 0-2 to see them again"
    )
    assert fold_pointer(3) == "folded, see the note at step 3"


def test_reminders_escalate() -> None:
    first, second, third, tenth = (reminder_text(n) for n in (1, 2, 3, 10))
    assert "PROGRESS:" in first and "STALE:" in first
    assert "2nd time" in second
    assert third.startswith("[IMPORTANT: 3 replies in a row")
    assert tenth.startswith("[IMPORTANT: 10 replies in a row")
    assert len({first, second, third}) == 3
