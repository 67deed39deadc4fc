from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings

from gateway.dialects import anthropic_messages, openai_chat
from gateway.dialects.convert import to_anthropic_tools, to_openai_tools, tool_dialect
from gateway.dialects.errors import DialectError
from tests.dialects.strategies import anthropic_bodies, openai_bodies

FAST = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(anthropic_bodies())
def test_anthropic_transcripts_encode_to_valid_chat_bodies(body: dict[str, Any]) -> None:
    t = anthropic_messages.decode_request(body)
    chat = openai_chat.encode_request(t)
    again = openai_chat.decode_request(chat)  # raises if the chat body is invalid
    assert [m.tool_call_id for m in again.messages if m.role == "tool"] == [
        m.tool_call_id for m in t.messages if m.role == "tool"
    ]
    assert not _keys(chat["messages"]) & {"cache_control", "citations", "signature", "is_error"}


def _keys(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in _keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()


@FAST
@given(openai_bodies(max_tokens=True))
def test_chat_transcripts_encode_to_valid_anthropic_bodies(body: dict[str, Any]) -> None:
    assume(any(m["role"] not in ("system", "developer") for m in body["messages"]))
    t = openai_chat.decode_request(body)
    messages = anthropic_messages.encode_request(t)
    again = anthropic_messages.decode_request(messages)
    assert [c.id for m in again.messages for c in m.tool_calls] == [
        c.id for m in t.messages for c in m.tool_calls
    ]


CLAUDE_CODE_REQUEST = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 32000,
    "stream": True,
    "metadata": {"user_id": "user_abc_session_42"},
    "system": [
        {"type": "text", "text": "You are Claude Code."},
        {"type": "text", "text": "Env: linux", "cache_control": {"type": "ephemeral"}},
    ],
    "tools": [
        {"name": "Bash", "description": "Run a command", "input_schema": {"type": "object"}},
        {"type": "web_search_20250305", "name": "web_search"},
    ],
    "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
    "thinking": {"type": "enabled", "budget_tokens": 4000},
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "list files"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "use ls", "signature": "EqQB"},
                {"type": "text", "text": "Listing."},
                {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "also hidden ones"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": "a.py\nb.py",
                    "cache_control": {"type": "ephemeral"},
                },
            ],
        },
    ],
}


def test_claude_code_request_becomes_a_vllm_chat_request() -> None:
    chat = openai_chat.encode_request(anthropic_messages.decode_request(CLAUDE_CODE_REQUEST))
    assert chat == {
        "model": "claude-sonnet-4-5",
        "max_tokens": 32000,
        "stream": True,
        "stream_options": {"include_usage": True},
        "user": "user_abc_session_42",
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "Bash",
                    "description": "Run a command",
                    "parameters": {"type": "object"},
                },
            }
        ],
        "messages": [
            {
                "role": "system",
                "content": [
                    {"type": "text", "text": "You are Claude Code."},
                    {"type": "text", "text": "Env: linux"},
                ],
            },
            {"role": "user", "content": "list files"},
            {
                "role": "assistant",
                "reasoning": "use ls",
                "content": "Listing.",
                "tool_calls": [
                    {
                        "id": "toolu_1",
                        "type": "function",
                        "function": {"name": "Bash", "arguments": '{"command": "ls"}'},
                    }
                ],
            },
            # Tool results come first, right after the call, as chat requires.
            {"role": "tool", "tool_call_id": "toolu_1", "content": "a.py\nb.py"},
            {"role": "user", "content": "also hidden ones"},
        ],
    }


def test_chat_request_becomes_an_anthropic_request() -> None:
    chat = {
        "model": "m",
        "max_completion_tokens": 50,
        "stop": "END",
        "user": "u1",
        "tool_choice": "required",
        "logprobs": True,
        "tools": [
            {"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}
        ],
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "developer", "content": "dev"},
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,QQ=="}}
                ],
            },
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "unsigned",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "bash", "arguments": '{"x": 1}'},
                    },
                    {
                        "id": "c2",
                        "type": "function",
                        "function": {"name": "bash", "arguments": "not json"},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "one"},
            {"role": "tool", "tool_call_id": "c2", "content": "two"},
            {"role": "system", "content": "late"},
        ],
    }
    out = anthropic_messages.encode_request(openai_chat.decode_request(chat))
    assert out == {
        "model": "m",
        "max_tokens": 50,
        "stop_sequences": ["END"],
        "metadata": {"user_id": "u1"},
        "tool_choice": {"type": "any"},
        "tools": [{"name": "bash", "input_schema": {"type": "object"}}],
        "system": [{"type": "text", "text": "sys"}, {"type": "text", "text": "dev"}],
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/jpeg", "data": "QQ=="},
                    }
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "c1", "name": "bash", "input": {"x": 1}},
                    {
                        "type": "tool_use",
                        "id": "c2",
                        "name": "bash",
                        "input": {"_raw_arguments": "not json"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "c1", "content": "one"},
                    {"type": "tool_result", "tool_use_id": "c2", "content": "two"},
                ],
            },
            {"role": "user", "content": "late"},
        ],
    }


def test_tool_schemas_convert_both_ways_and_are_told_apart_by_shape() -> None:
    anthropic = [{"name": "bash", "description": "run", "input_schema": {"type": "object"}}]
    openai = to_openai_tools(anthropic)
    assert [tool_dialect(t) for t in anthropic + openai] == ["anthropic", "openai"]
    assert to_anthropic_tools(openai) == anthropic
    assert to_openai_tools(openai) == openai
    assert to_anthropic_tools([{"type": "custom", "custom": {"name": "grammar"}}]) == []


def test_tool_error_is_visible_in_chat() -> None:
    body = {
        "model": "m",
        "max_tokens": 5,
        "messages": [
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t", "name": "x", "input": {}}],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t", "content": "boom", "is_error": True}
                ],
            },
        ],
    }
    chat = openai_chat.encode_request(anthropic_messages.decode_request(body))
    assert chat["messages"][1] == {"role": "tool", "tool_call_id": "t", "content": "Error: boom"}


def test_system_only_chat_body_has_no_anthropic_form() -> None:
    t = openai_chat.decode_request({"model": "m", "messages": [{"role": "system", "content": "s"}]})
    with pytest.raises(DialectError, match="needs a message after the system prompt"):
        anthropic_messages.encode_request(t)
