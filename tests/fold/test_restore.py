from __future__ import annotations

import pytest

from gateway.fold.renderer import RenderState
from gateway.fold.restore import (
    RESTORE_TOOL_NAME,
    parse_restore_spec,
    restore_outputs,
    restore_tool_schema,
    text_restore,
)
from gateway.transcript import Message, Text, Transcript, text_message, tool_message
from tests.fold.conftest import text_history, tool_history, turn


@pytest.mark.parametrize(
    ("spec", "expected"), [("5", (5, 5)), ("3-7", (3, 7)), (" 2 - 4 ", (2, 4))]
)
def test_parse_restore_spec(spec: str, expected: tuple[int, int]) -> None:
    assert parse_restore_spec(spec) == expected


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("", "cannot read restore steps ''"),
        ("five", "cannot read restore steps 'five'"),
        ("-3", "cannot read restore steps '-3'"),
        ("3-", "cannot read restore steps '3-'"),
        ("7-3", "ends (step 3) before it starts (7)"),
        (5, "must be a string"),
    ],
)
def test_bad_restore_specs_say_what_is_wrong(spec: object, problem: str) -> None:
    with pytest.raises(ValueError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        parse_restore_spec(spec)  # type: ignore[arg-type]


def test_restore_returns_the_original_bytes_of_each_step() -> None:
    outputs = ["a\r\n\tb  ", "", "ü ✓ \x00 end\n"]
    history = tool_history([turn("r", o) for o in outputs])
    assert restore_outputs(history, None, 0, 2) == list(enumerate(outputs))
    assert restore_outputs(history, None, 1, 1) == [(1, "")]


def test_restore_of_a_missing_step_names_it() -> None:
    history = tool_history([turn("r", "one"), turn("r", "two")])
    with pytest.raises(ValueError, match=r"step 2 does not exist \(this session has steps 0-1\)"):
        restore_outputs(history, None, 1, 2)
    with pytest.raises(ValueError, match="no steps yet"):
        restore_outputs(tool_history([]), None, 0, 0)


def test_restored_messages_are_not_steps() -> None:
    history = tool_history([turn("r", "zero"), turn("r", "one")])
    restore_call = Message("assistant", (Text("restore"),))
    messages = (
        *history.messages,
        restore_call,
        tool_message("call_x", "[restored step 0]\nzero"),
        *tool_history([turn("r", "two")], system=None).messages[1:],
    )
    extended = Transcript(messages)
    restored = RenderState(restored=frozenset({len(history.messages) + 1}))
    assert restore_outputs(extended, restored, 2, 2) == [(2, "two")]


def test_text_action_transcripts_restore_user_observations() -> None:
    history = text_history([turn("look", "listing"), turn("open", "file body")])
    assert restore_outputs(history, None, 0, 1) == [(0, "listing"), (1, "file body")]
    restored = Transcript((*history.messages, text_message("user", "[restored step 0]")))
    state = RenderState(restored=frozenset({len(history.messages)}))
    with pytest.raises(ValueError, match="step 2 does not exist"):
        restore_outputs(restored, state, 2, 2)


def test_restore_action_in_text() -> None:
    # The reader that serves: a command block holding only the command, blanks around it.
    assert text_restore("```\nrestore 4\n```\n") == "4"
    assert text_restore("```bash\nRESTORE 3 - 5\n```") == "3-5"
    assert text_restore("we should restore the file") is None
    assert text_restore("restore 4") is None  # not a command block


def test_restore_tool_schema() -> None:
    schema = restore_tool_schema()
    assert schema["type"] == "function"
    function = schema["function"]
    assert function["name"] == RESTORE_TOOL_NAME == "restore"
    assert function["parameters"]["required"] == ["steps"]
    assert function["parameters"]["properties"]["steps"]["type"] == "string"
