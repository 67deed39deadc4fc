"""What a step's anchors and a message's words hold, against their definitions written out
in full (each line's code and every word of the text), over generated texts: the
reference check's shortcuts (only lines with a slash split into words, short lines and
lines without a leading digit left as they are) must find exactly what the definitions do."""

from __future__ import annotations

import json
import re

from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway.fold.references import MIN_ID_CHARS, QUOTE_CHARS, anchors, said
from gateway.fold.spans import line_code
from gateway.transcript import Message, Text, ToolCall

# Line-number styles, path pieces and the characters the word breaks and extensions turn on.
PIECES = [
    *("  12\t", "7→", "31:", "4|", " 9\t", "٣\t", "²\t", "0:", " ", "\t", "\n", "\r\n"),
    *("/", ".", "..", "src/app/models.py", "/testbed/x/y.rs", "a/b", "./run.sh.", "x.py"),
    *("`", '"', "'", "(", ")", "[", "]", "{", "}", "<", ">", ",", ";", ":", "=", "|", "&"),
    *("def value(self):", "return result + 1", "call_9abc1234", "toolu_01Aabc", "-", "_"),
    *("a quoted line that is long enough to count", "é", "\u2028", "\x0c"),
    *("ab12", "ｘ９", "①", "Ⅻ", "ß", "٣٣٣٣", "x" * MIN_ID_CHARS, "7" * MIN_ID_CHARS),
]
texts = st.lists(st.sampled_from(PIECES), max_size=40).map("".join)

# The definitions, whole-text: every line's code, every word.
_WORD_BREAK = re.compile(r"[\s'\"`()\[\]{}<>,;:=|&]+")
_EXTENSION = re.compile(r"[\w-][\w.-]*\.[A-Za-z]\w*")
_TAB = re.compile(r" *(\d+)\t(.*)", re.DOTALL)
_ARROW = re.compile(r" *(\d+)→(.*)", re.DOTALL)
_WINDOW = re.compile(r"(\d+)([:|])(.*)", re.DOTALL)


def code_of(line: str) -> str:
    if m := _TAB.fullmatch(line) or _ARROW.fullmatch(line):
        return m.group(2)
    return m.group(3) if (m := _WINDOW.fullmatch(line)) else line


def paths_of(text: str) -> list[str]:
    out = []
    for word in _WORD_BREAK.split(text):
        word = word.rstrip(".")
        if "/" in word and _EXTENSION.fullmatch(word.rsplit("/", 1)[1]):
            out.append(word)
    return out


def ids_of(text: str) -> frozenset[str]:
    """Every word (a run of word characters and dashes) long enough to be an id, with a
    letter and a digit in it, as ``str`` classes them."""
    return frozenset(
        w
        for w in re.split(r"[^\w-]+", text)
        if len(w) >= MIN_ID_CHARS and any(c.isdigit() for c in w) and any(c.isalpha() for c in w)
    )


def keys(paths: list[str]) -> frozenset[str]:
    return frozenset("/".join(p.rstrip("/").split("/")[-2:]) for p in paths)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=8).map("".join))
def test_a_line_loses_exactly_its_line_number(line: str) -> None:
    assert line_code(line) == code_of(line)


@settings(max_examples=400, deadline=None)
@given(texts, texts)
@example("1\t" + "x" * QUOTE_CHARS + "\n" + "y" * QUOTE_CHARS, "")  # lines just long enough
def test_anchors_hold_the_long_lines_and_the_printed_paths_the_call_did_not_name(
    output: str, arguments: str
) -> None:
    found = anchors(output, arguments, "call_1")
    lines = {s for line in output.split("\n") if len(s := code_of(line).strip()) >= QUOTE_CHARS}
    assert found.lines == lines
    assert found.paths == keys([p for p in paths_of(output) if p not in arguments])
    assert found.call_id == "call_1"


@settings(max_examples=400, deadline=None)
@given(texts, texts)
def test_words_hold_the_paths_anywhere_in_the_text_and_the_arguments(text: str, cmd: str) -> None:
    call = ToolCall("c1", "bash", json.dumps({"cmd": cmd}))
    words = said(Message("assistant", (Text(text), call)))
    joined = "\n".join(t for t in (text, cmd) if t)
    expected = keys(paths_of(joined))
    assert (words.paths if words is not None else frozenset()) == expected


@settings(max_examples=400, deadline=None)
@given(texts, texts)
@example("call_9abc1234 toolu_01Aabc x" + "²" * MIN_ID_CHARS + " ٣٣٣٣abcd", "")
def test_words_hold_every_id_like_word_of_the_text_and_the_arguments(text: str, cmd: str) -> None:
    call = ToolCall("c1", "bash", json.dumps({"cmd": cmd}))
    words = said(Message("assistant", (Text(text), call)))
    joined = "\n".join(t for t in (text, cmd) if t)
    assert (words.ids if words is not None else frozenset()) == ids_of(joined)
