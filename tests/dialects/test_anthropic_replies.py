import json
from typing import Any

import pytest

from gateway.dialects.anthropic_replies import (
    AnthropicStreamTranslator,
    stop_reason,
    to_anthropic_response,
)
from gateway.dialects.chunks import ChunkAccumulator, format_sse
from gateway.dialects.errors import DialectError
from gateway.transcript import Text, Thinking, ToolCall

USAGE = {
    "prompt_tokens": 120,
    "completion_tokens": 30,
    "total_tokens": 150,
    "prompt_tokens_details": {"cached_tokens": 100},
}
ANTHROPIC_USAGE = {
    "input_tokens": 20,
    "output_tokens": 30,
    "cache_read_input_tokens": 100,
    "cache_creation_input_tokens": 0,
}


def test_completion_becomes_a_messages_response() -> None:
    completion = {
        "id": "chatcmpl-9",
        "object": "chat.completion",
        "model": "tiny",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Running it.",
                    "reasoning": "need ls",
                    "tool_calls": [
                        {
                            "id": "chatcmpl-tool-1",
                            "type": "function",
                            "function": {"name": "bash", "arguments": '{"command": "ls"}'},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
                "stop_reason": None,
            }
        ],
        "usage": USAGE,
    }
    assert to_anthropic_response(completion) == {
        "id": "chatcmpl-9",
        "type": "message",
        "role": "assistant",
        "model": "tiny",
        "content": [
            {"type": "thinking", "thinking": "need ls", "signature": ""},
            {"type": "text", "text": "Running it."},
            {
                "type": "tool_use",
                "id": "chatcmpl-tool-1",
                "name": "bash",
                "input": {"command": "ls"},
            },
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": ANTHROPIC_USAGE,
    }


@pytest.mark.parametrize(
    ("finish", "matched", "expected"),
    [
        ("stop", None, ("end_turn", None)),
        ("stop", 151645, ("end_turn", None)),  # vLLM reports a stop token id: not a sequence
        ("stop", "END", ("stop_sequence", "END")),
        ("length", None, ("max_tokens", None)),
        ("tool_calls", None, ("tool_use", None)),
        ("content_filter", None, ("refusal", None)),
        (None, None, (None, None)),
    ],
)
def test_stop_reasons(finish: str | None, matched: Any, expected: tuple[Any, Any]) -> None:
    assert stop_reason(finish, matched) == expected


def test_completion_without_choices_is_an_upstream_error() -> None:
    with pytest.raises(DialectError, match="no choices") as info:
        to_anthropic_response({"id": "x", "choices": []})
    assert info.value.status == 502


def _chunk(delta: dict[str, Any] | None = None, finish: str | None = None) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "model": "tiny",
        "choices": choices,
    }


def _call(index: int, arguments: str, call_id: str | None = None, name: str | None = None) -> dict:
    call: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
    if call_id:
        call.update(id=call_id, type="function")
        call["function"]["name"] = name
    return {"tool_calls": [call]}


VLLM_STREAM = [
    _chunk({"role": "assistant", "content": ""}),
    _chunk({"reasoning": "Let me ", "reasoning_content": "Let me "}),  # both, as vLLM has sent
    _chunk({"reasoning": "look."}),
    _chunk({"content": "I'll list"}),
    _chunk({"content": " files."}),
    _chunk(_call(0, "", "chatcmpl-tool-a", "bash")),
    _chunk(_call(0, '{"comm')),
    _chunk(_call(0, 'and": "ls')),
    _chunk(_call(0, ' -la"}')),
    _chunk(_call(1, '{"path"', "chatcmpl-tool-b", "read")),
    _chunk(_call(1, ': "a.py"}')),
    _chunk({}, finish="tool_calls"),
    {**_chunk(), "usage": USAGE},
]


def _run(chunks: list[dict[str, Any]]) -> tuple[AnthropicStreamTranslator, list]:
    translator = AnthropicStreamTranslator()
    events = [e for c in chunks for e in translator.feed(c)] + translator.finish()
    return translator, events


def test_stream_translation_event_sequence() -> None:
    _, events = _run(VLLM_STREAM)
    names = [name for name, _ in events]
    block = [
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
    ]
    json_block = ["content_block_start", *["content_block_delta"] * 3, "content_block_stop"]
    assert names == [
        "message_start",
        *block,
        *block,
        *json_block,
        *block,
        "message_delta",
        "message_stop",
    ]
    assert all(data["type"] == name for name, data in events)
    starts = [d for n, d in events if n == "content_block_start"]
    assert [(d["index"], d["content_block"]["type"]) for d in starts] == [
        (0, "thinking"),
        (1, "text"),
        (2, "tool_use"),
        (3, "tool_use"),
    ]
    assert starts[2]["content_block"] == {
        "type": "tool_use",
        "id": "chatcmpl-tool-a",
        "name": "bash",
        "input": {},
    }
    assert events[-2][1] == {
        "type": "message_delta",
        "delta": {"stop_reason": "tool_use", "stop_sequence": None},
        "usage": ANTHROPIC_USAGE,
    }


def test_stream_translation_reassembles_content() -> None:
    translator, events = _run(VLLM_STREAM)
    by_index: dict[int, str] = {}
    for name, data in events:
        if name == "content_block_delta":
            delta = data["delta"]
            piece = delta.get("text") or delta.get("thinking") or delta.get("partial_json")
            by_index[data["index"]] = by_index.get(data["index"], "") + piece
    assert by_index[0] == "Let me look."
    assert by_index[1] == "I'll list files."
    assert json.loads(by_index[2]) == {"command": "ls -la"}
    assert json.loads(by_index[3]) == {"path": "a.py"}
    reply = translator.reply()
    assert reply.parts == (
        Thinking("Let me look.", meta={"openai": {"field": "reasoning_content"}}),
        Text("I'll list files."),
        ToolCall("chatcmpl-tool-a", "bash", '{"command": "ls -la"}'),
        ToolCall("chatcmpl-tool-b", "read", '{"path": "a.py"}'),
    )


def test_accumulator_gives_the_chat_reply_message() -> None:
    acc = ChunkAccumulator()
    for chunk in VLLM_STREAM:
        acc.feed(chunk)
    assert acc.finish_reason == "tool_calls" and acc.usage == USAGE
    message = acc.message()
    assert message["content"] == "I'll list files."
    assert [c["function"]["arguments"] for c in message["tool_calls"]] == [
        '{"command": "ls -la"}',
        '{"path": "a.py"}',
    ]


def test_empty_stream_still_yields_a_well_formed_message() -> None:
    _, events = _run([])
    assert [n for n, _ in events] == ["message_start", "message_delta", "message_stop"]
    assert events[1][1]["delta"]["stop_reason"] == "end_turn"


def test_stop_sequence_stream() -> None:
    chunks = [_chunk({"content": "a"}), _chunk({}, finish="stop")]
    chunks[-1]["choices"][0]["stop_reason"] = "END"
    _, events = _run(chunks)
    assert events[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}


def test_interleaved_tool_deltas_are_refused() -> None:
    translator = AnthropicStreamTranslator()
    translator.feed(_chunk(_call(0, "{", "a", "x")))
    translator.feed(_chunk(_call(1, "{", "b", "y")))
    with pytest.raises(DialectError, match="resumed"):
        translator.feed(_chunk(_call(0, "}")))


def test_chunk_after_finish_is_refused() -> None:
    translator = AnthropicStreamTranslator()
    translator.finish()
    assert translator.finish() == []
    with pytest.raises(DialectError, match="after the end"):
        translator.feed(_chunk({"content": "late"}))


def test_format_sse() -> None:
    assert format_sse("message_stop", {"type": "message_stop"}) == (
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    )
    assert format_sse(None, "[DONE]") == b"data: [DONE]\n\n"
