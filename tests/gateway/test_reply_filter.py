"""The reply filter releases a text-action reply as it streams, holding back only what could
be a restore block, in work linear in the reply: a long reply of many chunks costs each chunk
its own length, not the length of everything before it.

The filter once kept the content so far as one string and searched all of it for fences on
every chunk (and read the last closed block with everything after it again): quadratic in a
long streamed reply. ``held_back`` below is that algorithm, kept as the reference: the
filter must release exactly what it released, chunk for chunk, on any text and any cut.
"""

from __future__ import annotations

import re
import tracemalloc
from collections.abc import Callable
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.fold.restore import text_restore
from gateway.steps import reply_filter
from gateway.steps.reply_filter import ReplyFilter


def held_back(pieces: list[str]) -> tuple[list[str], str]:
    """The reference: what each piece releases, rescanning the whole text every time; and
    what is still held at the end."""
    text, sent, released = "", 0, []
    for piece in pieces:
        text += piece
        fences = [m.start() for m in re.finditer("```", text)]
        if len(fences) % 2:
            safe = fences[-1]
        elif fences and text_restore(text[fences[-2] :]) is not None:
            safe = fences[-2]
        else:
            safe = len(text.rstrip("`"))
        if safe <= sent:
            released.append("")
        else:
            released.append(text[sent:safe])
            sent = safe
    return released, text[sent:]


def content_chunk(text: str) -> dict[str, Any]:
    return {"id": "c", "model": "m", "choices": [{"index": 0, "delta": {"content": text}}]}


def streamed(pieces: list[str], text_actions: bool = True) -> tuple[list[str], str, list[str]]:
    """What the filter releases for each piece, what it holds at the end (the text of its
    last chunk, or the restore block it took), and the restores it decided."""
    filt = ReplyFilter(text_actions=text_actions, text_restores=True)
    released = []
    for piece in pieces:
        out = filt.feed(content_chunk(piece))
        released.append("".join(c["choices"][0]["delta"].get("content", "") for c in out))
    last, decision = filt.finish()
    rest = "".join(c["choices"][0]["delta"]["content"] for c in last)
    held = decision.asked["content"] if decision.restores else rest
    return released, held, decision.restores


def check_against_reference(pieces: list[str]) -> None:
    released, held, restores = streamed(pieces)
    expected, expected_held = held_back(pieces)
    assert released == expected
    assert held == expected_held
    assert restores == ([action] if (action := text_restore(expected_held)) else [])
    assert "".join(released) + held == "".join(pieces)  # nothing lost, nothing doubled


# Text made of what matters to the filter: backticks, blanks, the restore command, digits.
TOKENS = ["`", "``", "```", " ", "\n", "restore", "RESTORE", "bash", "1", "2-4", " - ", "x", "é"]
texts = st.lists(st.sampled_from(TOKENS), max_size=40).map("".join)


@settings(max_examples=200, deadline=None)
@given(text=texts, cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=12))
def test_releases_what_the_whole_text_rescan_released(text: str, cuts: list[int]) -> None:
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    check_against_reference([text[a:b] for a, b in pairwise(bounds)])


@pytest.mark.parametrize(
    "pieces",
    [
        ["Let me look.\n", "``", "`", "\nrestore 3", "\n``", "`", "\n\n"],  # fence cut up
        ["```restore 2-4```", " ", "\n", "then more"],  # a restore, then it was not one
        ["```bash\nls\n```", "\n```restore 1```", "  \n"],  # a command, then a restore
        ["````", "restore 1", "```"],  # a fourth backtick opens no block
        ["a", "", "```", "", "restore 5", "", "```", ""],  # empty pieces change nothing
        list("``` restore 7 ```   \n"),  # one character at a time
    ],
)
def test_cut_fences_and_blocks(pieces: list[str]) -> None:
    check_against_reference(pieces)


def test_outside_text_actions_everything_streams_at_once() -> None:
    pieces = ["```restore 1", "```", "``"]
    released, held, restores = streamed(pieces, text_actions=False)
    assert (released, held, restores) == (pieces, "", [])


# Long replies of many short chunks, each shape one the rescan was quadratic on.
SHAPES: dict[str, Callable[[int], list[str]]] = {
    "prose": lambda n: ["word "] * n,
    "an open block that never closes": lambda n: ["```bash\n", *["ls -la\n"] * n],
    "blanks after a restore block": lambda n: ["```restore 3```", *[" "] * n],
    "many short blocks": lambda n: ["```a```\n"] * n,
    "backticks one at a time": lambda n: ["`"] * n,
}


def allocated_and_read(pieces: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    """Bytes the filter allocated streaming ``pieces`` (the sum of each chunk's peak) and
    the characters its restore-block reader was given."""
    read = 0

    def counting(held: str) -> str | None:
        nonlocal read
        read += len(held)
        return text_restore(held)

    monkeypatch.setattr(reply_filter, "text_restore", counting)
    filt = ReplyFilter(text_actions=True, text_restores=True)
    chunks = [content_chunk(piece) for piece in pieces]
    allocated = 0
    tracemalloc.start()
    try:
        for chunk in chunks:
            tracemalloc.reset_peak()
            before, _ = tracemalloc.get_traced_memory()
            filt.feed(chunk)
            allocated += tracemalloc.get_traced_memory()[1] - before
        filt.finish()
    finally:
        tracemalloc.stop()
    return allocated, read


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_long_reply_costs_each_chunk_its_own_length(
    shape: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four times the chunks cost about four times the work (the rescan: sixteen)."""
    make = SHAPES[shape]
    short = allocated_and_read(make(1_000), monkeypatch)
    long = allocated_and_read(make(4_000), monkeypatch)
    length = len("".join(make(4_000)))
    print(f"\n{shape}: allocated {short[0]:,} -> {long[0]:,} B, read {short[1]:,} -> {long[1]:,}")
    assert long[0] < 6 * short[0], f"{shape}: allocated {short[0]:,} then {long[0]:,} bytes"
    assert long[1] <= 2 * length, f"{shape}: the block reader read {long[1]:,} characters"
    check_against_reference(make(1_000))
