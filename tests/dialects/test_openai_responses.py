"""OpenAI Responses requests -> the neutral transcript -> a chat request; chat chunks ->
the Responses event stream."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from gateway.dialects.errors import DialectError
from gateway.dialects.fields import DIALECT_PARAM
from gateway.dialects.openai_chat import encode_request
from gateway.dialects.openai_responses import OPENAI_RESPONSES
from gateway.dialects.responses_events import ResponseWriter
from gateway.fold import make_renderer
from gateway.fold.renderer import RenderState
from gateway.request_cache import DecodeCache
from gateway.transcript import Opaque, Text, Thinking, ToolCall

# The tenant every decode here belongs to (the cache keys by tenant).
TENANT = "t"

FUNCTION_TOOL = {
    "type": "function",
    "name": "exec_command",
    "description": "Run a command.",
    "strict": False,
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
}
REASONING = {
    "type": "reasoning",
    "id": "rs_1",
    "summary": [{"type": "summary_text", "text": "look first"}],
    "content": [{"type": "reasoning_text", "text": "I should list the files."}],
    "encrypted_content": "gAAAA-opaque",
}


def call(call_id: str, cmd: str = "ls") -> dict[str, Any]:
    arguments = json.dumps({"cmd": cmd})
    return {
        "type": "function_call",
        "call_id": call_id,
        "name": "exec_command",
        "arguments": arguments,
    }


def output(call_id: str, text: str = "a.py b.py") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


def codex_body(*items: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A request shaped like the ones Codex 0.169 sends."""
    return {
        "model": "tiny",
        "instructions": "You are Codex.",
        "input": [
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "rules"}],
            },
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "list files"}],
            },
            *items,
        ],
        "tools": [FUNCTION_TOOL, {"type": "web_search", "external_web_access": False}],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "thread-1",
        **extra,
    }


def test_a_model_turn_becomes_one_assistant_message() -> None:
    t = OPENAI_RESPONSES.decode(codex_body(REASONING, call("c1"), output("c1")))
    roles = [m.role for m in t.messages]
    assert roles == ["system", "system", "user", "assistant", "tool"]
    assert t.messages[0].text == "You are Codex." and t.messages[1].text == "rules"
    turn = t.messages[3]
    thinking, tool_call = turn.parts
    assert isinstance(thinking, Thinking) and thinking.text == "I should list the files."
    assert thinking.meta["responses"]["item"] == REASONING  # carried whole, encrypted too
    assert isinstance(tool_call, ToolCall)
    assert (tool_call.id, tool_call.name, tool_call.arguments) == (
        "c1",
        "exec_command",
        '{"cmd": "ls"}',
    )
    assert t.messages[4].tool_call_id == "c1" and t.messages[4].text == "a.py b.py"


def test_the_chat_request_for_the_replica() -> None:
    body = codex_body(REASONING, call("c1"), output("c1"), max_output_tokens=64, temperature=0)
    chat = encode_request(OPENAI_RESPONSES.decode(body))
    assert [m["role"] for m in chat["messages"]] == [
        "system",
        "system",
        "user",
        "assistant",
        "tool",
    ]
    assistant = chat["messages"][3]
    assert assistant["reasoning"] == "I should list the files."
    assert assistant["tool_calls"][0]["function"] == {
        "name": "exec_command",
        "arguments": '{"cmd": "ls"}',
    }
    # Function tools converted; web_search runs only on OpenAI's side: left out.
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "exec_command",
                "description": "Run a command.",
                "parameters": FUNCTION_TOOL["parameters"],
                "strict": False,
            },
        }
    ]
    assert chat["max_tokens"] == 64 and chat["temperature"] == 0
    assert chat["tool_choice"] == "auto" and chat["parallel_tool_calls"] is True
    for dropped in ("input", "instructions", "store", "include", "reasoning", "prompt_cache_key"):
        assert dropped not in chat
    assert DIALECT_PARAM not in chat


def test_parameters_are_converted() -> None:
    body = {
        "model": "m",
        "input": "hi",
        "tool_choice": {"type": "function", "name": "exec_command"},
        "text": {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}}},
        "stop": ["\n"],
    }
    chat = encode_request(OPENAI_RESPONSES.decode(body))
    assert chat["messages"] == [{"role": "user", "content": "hi"}]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "exec_command"}}
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "out", "schema": {"type": "object"}},
    }
    assert chat["stop"] == ["\n"]  # not a Responses field: passed on to vLLM


def test_message_content_forms() -> None:
    body = {
        "model": "m",
        "input": [
            {"role": "user", "content": "plain"},
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "look"},
                    {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
                ],
            },
            {
                "type": "message",
                "role": "assistant",
                "id": "msg_1",
                "status": "completed",
                "content": [{"type": "output_text", "text": "seen", "annotations": []}],
            },
        ],
    }
    t = OPENAI_RESPONSES.decode(body)
    assert t.messages[0].parts == (Text("plain"),)
    assert t.messages[1].parts[1] == Opaque(
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    )
    assert t.messages[2].role == "assistant" and t.messages[2].text == "seen"
    chat = encode_request(t)
    assert chat["messages"][2] == {"role": "assistant", "content": "seen"}


BAD = [
    ("no input", {"model": "m"}, "input"),
    ("input not a list", {"model": "m", "input": 5}, "input"),
    ("empty input", {"model": "m", "input": []}, "input"),
    ("unknown item type", {"model": "m", "input": [{"type": "mystery"}]}, "input[0].type"),
    ("item type not a string", {"model": "m", "input": [{"type": ["x"]}]}, "input[0].type"),
    (
        "reasoning text missing",
        {"model": "m", "input": [{"type": "reasoning", "summary": [{"type": "summary_text"}]}]},
        "input[0].summary[0].text",
    ),
    (
        "output without its call",
        {"model": "m", "input": [{"role": "user", "content": "x"}, output("nope")]},
        "input[1].call_id",
    ),
    (
        "arguments not a string",
        {"model": "m", "input": [{**call("c1"), "arguments": {"cmd": "ls"}}]},
        "input[0].arguments",
    ),
    (
        "unknown role",
        {"model": "m", "input": [{"role": "wizard", "content": "x"}]},
        "input[0].role",
    ),
    ("temperature type", {"model": "m", "input": "x", "temperature": "hot"}, "temperature"),
    (
        "max tokens type",
        {"model": "m", "input": "x", "max_output_tokens": 1.5},
        "max_output_tokens",
    ),
    ("instructions type", {"model": "m", "input": "x", "instructions": 3}, "instructions"),
    ("tools not a list", {"model": "m", "input": "x", "tools": {}}, "tools"),
    (
        "tool without a name",
        {"model": "m", "input": "x", "tools": [{"type": "function"}]},
        "tools[0].name",
    ),
    ("text format type", {"model": "m", "input": "x", "text": {"format": "json"}}, "text.format"),
    (
        "hosted tool_choice",
        {"model": "m", "input": "x", "tool_choice": {"type": "web_search"}},
        "tool_choice",
    ),
    (
        "unsupported part",
        {
            "model": "m",
            "input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}],
        },
        "input[0].content[0].type",
    ),
]


@pytest.mark.parametrize(("why", "body", "param"), BAD, ids=[c[0] for c in BAD])
def test_bad_requests_name_the_field(why: str, body: dict[str, Any], param: str) -> None:
    with pytest.raises(DialectError) as err:
        OPENAI_RESPONSES.decode(body)
    assert err.value.param == param, why
    assert err.value.status == 400


def test_incremental_decode_is_the_full_decode() -> None:
    """Codex re-sends the whole input each step: only the new items are decoded again."""
    cache = DecodeCache()
    items: list[dict[str, Any]] = []
    previous = None
    for step in range(4):
        items += [
            REASONING | {"id": f"rs_{step}"},
            call(f"c{step}"),
            output(f"c{step}", f"out {step}"),
        ]
        body = codex_body(*copy.deepcopy(items))
        decoded = cache.decode(OPENAI_RESPONSES, body, ["thread-1"], tenant=TENANT)
        assert decoded.transcript == OPENAI_RESPONSES.decode(codex_body(*copy.deepcopy(items)))
        if previous is not None:
            kept = len(previous.transcript.messages)
            assert all(
                a is b
                for a, b in zip(
                    previous.transcript.messages, decoded.transcript.messages[:kept], strict=True
                )
            )
        previous = decoded


@pytest.mark.parametrize("strategy", ["refold", "cliff", "mask", "clip", "refold+cliff"])
def test_reasoning_stays_with_its_call_through_every_renderer(strategy: str) -> None:
    items: list[dict[str, Any]] = []
    for step in range(12):
        reasoning = REASONING | {
            "id": f"rs_{step}",
            "content": [{"type": "reasoning_text", "text": f"think {step}"}],
        }
        items += [
            reasoning,
            call(f"c{step}", f"cat f{step}"),
            output(f"c{step}", f"line {step}\n" * 400),
        ]
    t = OPENAI_RESPONSES.decode(codex_body(*items))
    renderer = make_renderer(strategy, k=3, budget=4000)
    rendered = renderer.render(t, RenderState(), None).transcript
    for m in rendered.messages:
        if any(isinstance(p, Thinking) for p in m.parts):
            assert m.role == "assistant" and (m.tool_calls or m.text), (strategy, m)
    for m in rendered.messages:
        for c in m.tool_calls:
            thinking = [p for p in m.parts if isinstance(p, Thinking)]
            assert [p.text for p in thinking] in ([], [f"think {c.id[1:]}"]), (strategy, m)


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return {"id": "chatcmpl-1", "model": "tiny", "choices": [choice], **extra}


USAGE = {
    "prompt_tokens": 100,
    "completion_tokens": 9,
    "prompt_tokens_details": {"cached_tokens": 64},
}


def run_writer(
    chunks: list[dict[str, Any]], body: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    writer = ResponseWriter(body or {"model": "tiny"})
    events = writer.start()
    for c in chunks:
        events += writer.feed(c)
    events += writer.finish()
    events.append(writer.terminal())
    return events


def test_stream_events_in_the_api_order() -> None:
    arguments = '{"cmd": "ls"}'
    events = run_writer(
        [
            chunk({"role": "assistant", "reasoning": "hmm"}),
            chunk({"content": "Listing"}),
            chunk({"content": " files."}),
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_1",
                            "function": {"name": "exec_command", "arguments": ""},
                        }
                    ]
                }
            ),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": arguments[:5]}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": arguments[5:]}}]}),
            chunk({}, "tool_calls"),
            {"id": "chatcmpl-1", "choices": [], "usage": USAGE},
        ]
    )
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",  # reasoning
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",  # message
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",  # function call
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done[1]["content"] == [
        {"type": "output_text", "text": "Listing files.", "annotations": []}
    ]
    assert done[2] == {
        "id": done[2]["id"],
        "type": "function_call",
        "status": "completed",
        "call_id": "call_1",
        "name": "exec_command",
        "arguments": arguments,
    }
    final = events[-1]["response"]
    assert final["status"] == "completed" and final["output"] == done
    assert final["id"] == events[0]["response"]["id"]
    assert final["usage"] == {
        "input_tokens": 100,
        "input_tokens_details": {"cached_tokens": 64},
        "output_tokens": 9,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 109,
    }


def test_a_reply_cut_by_max_tokens_completes_with_an_incomplete_status() -> None:
    events = run_writer([chunk({"content": "abc"}), chunk({}, "length")])
    assert events[-1]["type"] == "response.completed"  # the stream's end, for every harness
    assert events[-1]["response"]["status"] == "incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_interleaved_call_deltas_are_refused() -> None:
    writer = ResponseWriter({"model": "m"})
    start = {"index": 0, "id": "a", "function": {"name": "f", "arguments": ""}}
    writer.feed(chunk({"tool_calls": [start]}))
    writer.feed(chunk({"tool_calls": [{**start, "index": 1, "id": "b"}]}))
    with pytest.raises(DialectError, match="resumed"):
        writer.feed(chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}))


def test_conversations_without_ids_keep_their_own_decode() -> None:
    """The cache keys a session by its first items when the request names none."""
    cache = DecodeCache()

    def body(task: str, steps: int) -> dict[str, Any]:
        items = [x for s in range(steps) for x in (call(f"c{s}"), output(f"c{s}"))]
        return {"model": "m", "input": [{"role": "user", "content": task}, *items]}

    a = cache.decode(OPENAI_RESPONSES, body("task a", 1), tenant=TENANT).transcript
    cache.decode(OPENAI_RESPONSES, body("task b", 1), tenant=TENANT)
    grown = cache.decode(OPENAI_RESPONSES, body("task a", 2), tenant=TENANT).transcript
    assert all(x is y for x, y in zip(a.messages, grown.messages[:3], strict=True))
