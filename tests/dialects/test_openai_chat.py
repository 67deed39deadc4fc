import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from gateway.dialects.errors import DialectError
from gateway.dialects.openai_chat import decode_reply, decode_request, encode_request
from gateway.transcript import Opaque, Text, Thinking, ToolCall
from tests.dialects.strategies import openai_bodies

FAST = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(openai_bodies())
def test_round_trip_is_lossless(body: dict[str, Any]) -> None:
    sent = copy.deepcopy(body)
    assert encode_request(decode_request(body)) == sent
    assert body == sent  # decoding does not touch the caller's body


def _body(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": list(messages), **extra}


ASSISTANT_CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{"}}],
}


def test_decode_maps_roles_parts_and_calls() -> None:
    t = decode_request(
        _body(
            {"role": "developer", "content": "be brief"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "hi"},
                    {"type": "image_url", "image_url": {"url": "u"}},
                ],
            },
            {**ASSISTANT_CALL, "reasoning_content": "think"},
            {"role": "tool", "tool_call_id": "c1", "content": "out"},
        )
    )
    system, user, assistant, tool = t.messages
    assert system.role == "system" and system.text == "be brief"
    assert user.parts[0] == Text("hi")
    assert isinstance(user.parts[1], Opaque) and user.parts[1].data["type"] == "image_url"
    assert isinstance(assistant.parts[0], Thinking) and assistant.thinking == "think"
    assert assistant.tool_calls == (ToolCall("c1", "ls", "{"),)  # arguments kept verbatim
    assert (tool.role, tool.tool_call_id, tool.text) == ("tool", "c1", "out")
    assert t.params["model"] == "tiny"


def test_decode_reply_reads_sdk_model_dump() -> None:
    reply = decode_reply(
        {
            "role": "assistant",
            "content": "done",
            "reasoning": "r",
            "refusal": None,
            "function_call": None,
            "annotations": None,
            "tool_calls": [],
        }
    )
    assert (reply.role, reply.text, reply.thinking, reply.tool_calls) == (
        "assistant",
        "done",
        "r",
        (),
    )


def test_decode_reply_rejects_non_assistant() -> None:
    with pytest.raises(DialectError, match="assistant"):
        decode_reply({"role": "user", "content": "x"})


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ([], None, "JSON object"),
        ({"messages": [{"role": "user", "content": "x"}]}, "model", "missing"),
        ({"model": "m"}, "messages", "missing"),
        ({"model": "m", "messages": {}}, "messages", "array"),
        ({"model": "m", "messages": []}, "messages", "at least one"),
        (_body("hi"), "messages[0]", "object"),
        (_body({"content": "x"}), "messages[0].role", "missing"),
        (_body({"role": "robot", "content": "x"}), "messages[0].role", "unknown role 'robot'"),
        (_body({"role": "function", "name": "f", "content": "x"}), "messages[0].role", "legacy"),
        (
            _body({"role": "assistant", "content": "x", "function_call": {"name": "f"}}),
            "messages[0].function_call",
            "legacy",
        ),
        (_body({"role": "user", "content": 3}), "messages[0].content", "string, an array"),
        (_body({"role": "user"}), "messages[0].content", "needs content"),
        (_body({"role": "user", "content": None}), "messages[0].content", "needs content"),
        (
            _body({"role": "user", "content": [{"text": "x"}]}),
            "messages[0].content[0].type",
            "missing",
        ),
        (
            _body({"role": "user", "content": [{"type": "text", "text": 1}]}),
            "messages[0].content[0].text",
            "string",
        ),
        (_body({"role": "assistant", "tool_calls": {}}), "messages[0].tool_calls", "array"),
        (
            _body({"role": "user", "content": "x", "tool_calls": []}),
            "messages[0].tool_calls",
            "only assistant",
        ),
        (
            _body(
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": {}}}],
                }
            ),
            "messages[0].tool_calls[0].function.arguments",
            "string",
        ),
        (
            _body(
                {"role": "assistant", "tool_calls": [{"id": "c", "type": "custom", "custom": {}}]}
            ),
            "messages[0].tool_calls[0].type",
            "unsupported",
        ),
        (_body({"role": "tool", "content": "x"}), "messages[0].tool_call_id", "missing"),
        (
            _body({"role": "tool", "tool_call_id": "c1", "content": "x"}, ASSISTANT_CALL),
            "messages[0].tool_call_id",
            "does not answer",
        ),
        # An Anthropic image or document part is converted upstream (``part_to_openai``):
        # its source is checked as the Anthropic dialect checks it (it raised there, a 500).
        (
            _body({"role": "user", "content": [{"type": "image", "source": "x"}]}),
            "messages[0].content[0].source",
            "object",
        ),
        (
            _body({"role": "user", "content": [{"type": "document", "source": {"data": 1}}]}),
            "messages[0].content[0].source.data",
            "string",
        ),
        (
            _body({"role": "user", "content": [{"type": "image"}]}),
            "messages[0].content[0].source",
            "missing",
        ),
        (_body({"role": "user", "content": "x"}, tools={}), "tools", "array"),
        (_body({"role": "user", "content": "x"}, tools=["bash"]), "tools[0]", "object"),
        (
            _body({"role": "user", "content": "x"}, **{"x-foldgate-dialect": "openai"}),
            "x-foldgate-dialect",
            "reserved",
        ),
    ],
)
def test_bad_bodies_name_the_field(body: Any, param: str | None, message: str) -> None:
    with pytest.raises(DialectError, match=message) as info:
        decode_request(body)
    assert info.value.param == param
    assert info.value.status == 400


def test_encode_follows_changed_parts_not_stale_hints() -> None:
    t = decode_request(
        _body({"role": "user", "content": [{"type": "text", "text": "a"}]}, ASSISTANT_CALL)
    )
    user, assistant = t.messages
    edited = t.with_messages([user.with_text("b"), assistant.with_text("now text")])
    out = encode_request(edited)["messages"]
    assert out[0]["content"] == [{"type": "text", "text": "b"}]  # still a list, as sent
    assert out[1]["content"] == "now text"  # was null; a null can no longer hold the text
