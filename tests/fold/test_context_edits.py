"""Anthropic's context editing as the gateway applies it: the edits over a rendering of a
Claude-Code-shaped Messages history (Read/Bash/Grep tool uses, signed thinking), checked
against the request parser's defaults, what each edit clears and that a cleared result
restores to its exact bytes from the history."""

from __future__ import annotations

import pytest

from gateway.dialects.anthropic_context import (
    CLEAR_THINKING,
    CLEAR_TOOL_USES,
    AppliedEdit,
    ClearThinking,
    ClearToolUses,
    context_management_body,
    parse_context_management,
)
from gateway.dialects.anthropic_messages import decode_request
from gateway.dialects.errors import DialectError
from gateway.fold.context_edits import apply_context_edits, cleared_note
from gateway.fold.renderer import RenderState
from gateway.fold.restore import restore_outputs
from gateway.steps.render import calibrated
from gateway.tokens import estimate_tokens
from gateway.transcript import Thinking, Transcript

TOOLS = [
    {"name": "Read", "description": "Read a file", "input_schema": {"type": "object"}},
    {"name": "Bash", "description": "Run a command", "input_schema": {"type": "object"}},
    {"name": "Grep", "description": "Search files", "input_schema": {"type": "object"}},
]
CALLS = [
    ("Read", {"file_path": "/repo/app.py"}, "     1\timport os\n" + "     2\tx = 1\n" * 400),
    ("Bash", {"command": "pytest -q"}, "F" * 40 + "\n" + "E   assert 1 == 2\n" * 200),
    ("Grep", {"pattern": "def main"}, "/repo/app.py:12:def main():\n" * 150),
    ("Read", {"file_path": "/repo/util.py"}, "     1\tdef f():\n" * 300),
    ("Bash", {"command": "git diff"}, "+ x = 2\n" * 250),
]


def claude_code_body(n_calls: int = len(CALLS), thinking: bool = True) -> dict:
    """A Messages body as Claude Code sends it: system blocks, a tool-use loop with signed
    thinking before each call, tool_result blocks in user turns."""
    messages: list[dict] = [{"role": "user", "content": [{"type": "text", "text": "Fix it."}]}]
    for i, (name, args, output) in enumerate(CALLS[:n_calls]):
        blocks: list[dict] = []
        if thinking:
            blocks.append(
                {
                    "type": "thinking",
                    "thinking": f"I should look at {i}. " * 30,
                    "signature": f"sig{i}",
                }
            )
        blocks.append({"type": "tool_use", "id": f"toolu_{i:02d}", "name": name, "input": args})
        messages.append({"role": "assistant", "content": blocks})
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": f"toolu_{i:02d}", "content": output}
                ],
            }
        )
    return {
        "model": "claude-sonnet-4-5",
        "max_tokens": 1024,
        "system": [
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}
        ],
        "tools": TOOLS,
        "messages": messages,
    }


def edited(edits: list[dict], body: dict | None = None):
    history = decode_request(body or claude_code_body())
    parsed = parse_context_management({"edits": edits})
    return history, apply_context_edits(history, history, RenderState(), parsed, estimate_tokens)


def tool_texts(t: Transcript) -> list[str]:
    return [m.text for m in t.messages if m.role == "tool"]


def test_defaults_are_anthropics() -> None:
    (tool_uses,) = parse_context_management({"edits": [{"type": CLEAR_TOOL_USES}]})
    assert tool_uses == ClearToolUses("input_tokens", 100_000, 3, 0, frozenset(), False)
    (thinking,) = parse_context_management({"edits": [{"type": CLEAR_THINKING}]})
    assert thinking == ClearThinking(1)
    assert parse_context_management({"edits": [{"type": CLEAR_THINKING, "keep": "all"}]}) == (
        ClearThinking(None),
    )


def test_below_the_default_trigger_nothing_is_cleared() -> None:
    history, result = edited([{"type": CLEAR_TOOL_USES}])
    assert result.applied == ()
    assert result.transcript == history
    assert result.restore_tool is None


def test_clear_tool_uses_keeps_the_last_ones_and_names_the_restore() -> None:
    edit = {
        "type": CLEAR_TOOL_USES,
        "trigger": {"type": "input_tokens", "value": 1000},
        "keep": {"type": "tool_uses", "value": 2},
    }
    history, result = edited([edit])
    texts = tool_texts(result.transcript)
    assert texts[:3] == [cleared_note(s, CALLS[s][0], "restore") for s in range(3)]
    assert texts[3:] == tool_texts(history)[3:]
    (applied,) = result.applied
    before = sum(estimate_tokens(m) for m in history.messages)
    after = sum(estimate_tokens(m) for m in result.transcript.messages)
    assert applied.type == CLEAR_TOOL_USES and applied.cleared == 3
    # what the rendering shrank by, net of the restore tool the edit adds
    assert 0 < applied.cleared_input_tokens < before - after
    assert result.restore_tool == "restore"
    assert result.transcript.tools[-1]["function"]["name"] == "restore"
    # the inputs stay, and restore gives the exact bytes back from the history
    assert [m.tool_calls for m in result.transcript.messages] == [
        m.tool_calls for m in history.messages
    ]
    assert restore_outputs(history, RenderState(), 0, 2) == [(s, CALLS[s][2]) for s in range(3)]
    # the history is untouched
    assert tool_texts(history) == [c[2] for c in CALLS]


def test_exclude_tools_and_clear_tool_inputs() -> None:
    edit = {
        "type": CLEAR_TOOL_USES,
        "trigger": {"type": "tool_uses", "value": 2},
        "keep": {"type": "tool_uses", "value": 1},
        "exclude_tools": ["Read"],
        "clear_tool_inputs": ["Bash"],
    }
    history, result = edited([edit])
    texts = tool_texts(result.transcript)
    # Read (steps 0, 3) kept; Bash and Grep (steps 1, 2) cleared; the last use kept
    assert texts[0] == CALLS[0][2] and texts[3] == CALLS[3][2] and texts[4] == CALLS[4][2]
    assert texts[1].startswith("[Bash result cleared") and texts[2].startswith("[Grep result")
    assert result.applied[0].cleared == 2
    calls = [m.tool_calls[0] for m in result.transcript.messages if m.tool_calls]
    assert calls[1].arguments == "{}"  # Bash's input cleared
    sent = [m.tool_calls[0] for m in history.messages if m.tool_calls]
    assert calls[2] == sent[2] and calls[4] == sent[4]  # Grep's and the kept use's stay


def test_clear_at_least_not_reached_applies_nothing() -> None:
    edit = {
        "type": CLEAR_TOOL_USES,
        "trigger": {"type": "input_tokens", "value": 1000},
        "keep": {"type": "tool_uses", "value": 4},
        "clear_at_least": {"type": "input_tokens", "value": 50_000},
    }
    history, result = edited([edit])
    assert result.applied == () and result.transcript == history


def test_clear_thinking_keeps_the_last_turns() -> None:
    edit = {"type": CLEAR_THINKING, "keep": {"type": "thinking_turns", "value": 2}}
    history, result = edited([edit])
    thinking = [
        any(isinstance(p, Thinking) for p in m.parts)
        for m in result.transcript.messages
        if m.role == "assistant"
    ]
    assert thinking == [False, False, False, True, True]
    (applied,) = result.applied
    assert applied == AppliedEdit(CLEAR_THINKING, 3, applied.cleared_input_tokens)
    assert applied.cleared_input_tokens == sum(
        estimate_tokens(a) - estimate_tokens(b)
        for a, b in zip(history.messages, result.transcript.messages, strict=True)
    )
    # the calls are untouched
    assert [m.tool_calls for m in result.transcript.messages] == [
        m.tool_calls for m in history.messages
    ]


def test_both_edits_in_order_and_the_response_shape() -> None:
    edits = [
        {"type": CLEAR_THINKING, "keep": {"type": "thinking_turns", "value": 1}},
        {"type": CLEAR_TOOL_USES, "trigger": {"type": "input_tokens", "value": 100}},
    ]
    _, result = edited(edits)
    body = context_management_body(result.applied)
    assert [e["type"] for e in body["applied_edits"]] == [CLEAR_THINKING, CLEAR_TOOL_USES]
    assert body["applied_edits"][0]["cleared_thinking_turns"] == 4
    assert body["applied_edits"][1]["cleared_tool_uses"] == 2
    assert all(e["cleared_input_tokens"] > 0 for e in body["applied_edits"])


def test_deterministic() -> None:
    edits = [{"type": CLEAR_TOOL_USES, "trigger": {"type": "tool_uses", "value": 1}}]
    assert edited(edits)[1] == edited(edits)[1]


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        ({"edits": [{"type": "clear_everything_20990101"}]}, "context_management.edits[0].type"),
        (
            {"edits": [{"type": CLEAR_TOOL_USES, "keep_all": True}]},
            "context_management.edits[0].keep_all",
        ),
        (
            {"edits": [{"type": CLEAR_TOOL_USES, "trigger": {"type": "seconds", "value": 5}}]},
            "context_management.edits[0].trigger.type",
        ),
        (
            {"edits": [{"type": CLEAR_TOOL_USES, "keep": {"type": "tool_uses", "value": -1}}]},
            "context_management.edits[0].keep.value",
        ),
        (
            {"edits": [{"type": CLEAR_TOOL_USES, "exclude_tools": "Read"}]},
            "context_management.edits[0].exclude_tools",
        ),
        (
            {"edits": [{"type": CLEAR_THINKING, "keep": {"type": "thinking_turns", "value": 0}}]},
            "context_management.edits[0].keep.value",
        ),
        (
            {"edits": [{"type": CLEAR_TOOL_USES}, {"type": CLEAR_THINKING}]},
            "context_management.edits[1].type",
        ),
        (
            {"edits": [{"type": CLEAR_TOOL_USES}, {"type": CLEAR_TOOL_USES}]},
            "context_management.edits[1].type",
        ),
        ({"edit": []}, "context_management.edit"),
        ({"edits": {}}, "context_management.edits"),
    ],
)
def test_bad_context_management_is_refused_at_decode(raw: dict, param: str) -> None:
    body = {**claude_code_body(1), "context_management": raw}
    with pytest.raises(DialectError) as err:
        decode_request(body)
    assert err.value.param == param


def test_counts_in_the_replicas_tokens_follow_the_calibration() -> None:
    history = decode_request(claude_code_body())
    parsed = parse_context_management(
        {"edits": [{"type": CLEAR_TOOL_USES, "trigger": {"type": "tool_uses", "value": 1}}]}
    )
    plain = apply_context_edits(history, history, RenderState(), parsed, estimate_tokens)
    scaled = apply_context_edits(
        history, history, RenderState(), parsed, calibrated(estimate_tokens, 1.5)
    )
    assert scaled.transcript == plain.transcript
    (a,), (b,) = plain.applied, scaled.applied
    assert abs(b.cleared_input_tokens - 1.5 * a.cleared_input_tokens) <= 2 * len(CALLS)
