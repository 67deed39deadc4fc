import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from gateway.dialects.anthropic_messages import decode_request, encode_request
from gateway.dialects.errors import DialectError
from gateway.transcript import Opaque, Text, Thinking, ToolCall
from tests.dialects.strategies import anthropic_bodies

FAST = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(anthropic_bodies())
def test_round_trip_is_lossless(body: dict[str, Any]) -> None:
    sent = copy.deepcopy(body)
    assert encode_request(decode_request(body)) == sent
    assert body == sent


def _body(*messages: Any, **extra: Any) -> dict[str, Any]:
    return {"model": "claude", "max_tokens": 100, "messages": list(messages), **extra}


TOOL_USE = {
    "role": "assistant",
    "content": [
        {"type": "thinking", "thinking": "hmm", "signature": "sig=="},
        {"type": "redacted_thinking", "data": "opaque-bytes"},
        {"type": "tool_use", "id": "t1", "name": "bash", "input": {"cmd": "ls", "n": 1.5}},
        {"type": "tool_use", "id": "t2", "name": "bash", "input": {}},
    ],
}


def test_decode_splits_tool_results_out_of_the_user_message() -> None:
    t = decode_request(
        _body(
            {"role": "user", "content": "go"},
            TOOL_USE,
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "note"},
                    {"type": "tool_result", "tool_use_id": "t2", "content": "b", "is_error": True},
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [{"type": "text", "text": "a"}],
                    },
                ],
            },
            system=[{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}],
        )
    )
    roles = [m.role for m in t.messages]
    assert roles == ["system", "user", "assistant", "tool", "tool", "user"]
    system, _, assistant, first, second, user = t.messages
    assert system.text == "sys" and system.parts[0].meta["anthropic"]["fields"]["cache_control"]
    thinking, redacted, call, _ = assistant.parts
    assert thinking == Thinking("hmm", "sig==")
    assert (
        isinstance(redacted, Thinking) and redacted.meta["anthropic"]["redacted"] == "opaque-bytes"
    )
    assert isinstance(call, ToolCall) and json.loads(call.arguments) == {"cmd": "ls", "n": 1.5}
    assert (first.tool_call_id, first.is_error, first.text) == ("t2", True, "b")
    assert (second.tool_call_id, second.is_error, second.text) == ("t1", False, "a")
    assert user.parts == (Text("note"),)


def test_unknown_blocks_stay_opaque() -> None:
    block = {"type": "document", "source": {"type": "base64", "data": "JVBER"}, "title": "x"}
    t = decode_request(_body({"role": "user", "content": [block]}))
    assert t.messages[0].parts == (Opaque(block),)


def test_renderer_edits_keep_a_valid_grouping() -> None:
    body = _body(
        {"role": "user", "content": "go"},
        TOOL_USE,
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "long output"},
                {"type": "text", "text": "a"},
                {"type": "tool_result", "tool_use_id": "t2", "content": "x"},
                {"type": "text", "text": "b"},
            ],
        },
    )
    t = decode_request(body)
    # A renderer stubs a result and merges the user text: the recorded order no longer fits.
    msgs = list(t.messages)
    msgs[2] = msgs[2].with_text("[step 0] stub")
    msgs[4] = msgs[4].with_text("ab")
    out = encode_request(t.with_messages(msgs))["messages"][2]
    assert [b["type"] for b in out["content"]] == ["tool_result", "tool_result", "text"]
    assert out["content"][0]["content"] == "[step 0] stub"
    assert out["content"][2]["text"] == "ab"


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ("text", None, "JSON object"),
        ({"max_tokens": 1, "messages": []}, "model", "missing"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens", "missing"),
        ({"model": "m", "max_tokens": "9", "messages": []}, "max_tokens", "integer"),
        ({"model": "m", "max_tokens": 9}, "messages", "missing"),
        (_body(), "messages", "at least one"),
        (_body({"role": "system", "content": "x"}), "messages[0].role", "top-level 'system'"),
        (_body({"role": "tool", "content": "x"}), "messages[0].role", "unknown role 'tool'"),
        (_body({"role": "user"}), "messages[0].content", "missing"),
        (_body({"role": "user", "content": 7}), "messages[0].content", "array"),
        (_body({"role": "user", "content": ["x"]}), "messages[0].content[0]", "object"),
        (
            _body({"role": "user", "content": [{"text": "x"}]}),
            "messages[0].content[0].type",
            "missing",
        ),
        (
            _body({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope"}]}),
            "messages[0].content[0].tool_use_id",
            "does not answer",
        ),
        (
            _body(
                TOOL_USE,
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t1", "is_error": "yes"}],
                },
            ),
            "messages[1].content[0].is_error",
            "boolean",
        ),
        (
            _body(
                {
                    "role": "user",
                    "content": [{"type": "tool_use", "id": "a", "name": "b", "input": {}}],
                }
            ),
            "messages[0].content[0].type",
            "only allowed in assistant",
        ),
        (
            _body({"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "a"}]}),
            "messages[0].content[0].type",
            "only allowed in user",
        ),
        (
            _body(
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "a", "name": "b", "input": "{}"}],
                }
            ),
            "messages[0].content[0].input",
            "object",
        ),
        (
            _body(
                {
                    "role": "assistant",
                    "content": [{"type": "thinking", "thinking": "t", "signature": 5}],
                }
            ),
            "messages[0].content[0].signature",
            "string",
        ),
        (
            _body({"role": "user", "content": "x"}, system=[{"type": "image"}]),
            "system[0].type",
            "text blocks",
        ),
        (_body({"role": "user", "content": "x"}, system=3), "system", "array"),
        (_body({"role": "user", "content": "x"}, tools=[1]), "tools[0]", "object"),
    ],
)
def test_bad_bodies_name_the_field(body: Any, param: str | None, message: str) -> None:
    with pytest.raises(DialectError, match=message) as info:
        decode_request(body)
    assert info.value.param == param


def test_a_system_turn_inside_messages_round_trips() -> None:
    # Claude Code 2.1 sends one at messages[1]; a leading one is still refused.
    turn = {
        "role": "system",
        "content": [{"type": "text", "text": "ctx", "cache_control": {"type": "ephemeral"}}],
    }
    body = _body({"role": "user", "content": "hi"}, turn, {"role": "system", "content": "plain"})
    t = decode_request(body)
    assert [m.role for m in t.messages] == ["user", "system", "system"]
    assert t.messages[1].text == "ctx"
    assert encode_request(t) == body
