"""Streamed tool calls, as both reply writers (Anthropic events, Responses events) read
them through ``chunks.call_delta``."""

from __future__ import annotations

import pytest

from gateway.dialects.anthropic_replies import AnthropicStreamTranslator
from gateway.dialects.chunks import call_delta
from gateway.dialects.errors import DialectError
from gateway.dialects.responses_events import ResponseWriter


def call_chunk(index: int, arguments: str, name: str | None = None) -> dict:
    call = {"index": index, "function": {"arguments": arguments}}
    if name is not None:
        call.update(id=f"call_{index}", function={"name": name, "arguments": arguments})
    return {"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}


TEXT = {"choices": [{"index": 0, "delta": {"content": "between"}}]}


def test_a_call_starts_once_and_continues_while_open():
    begun: set[int] = set()
    first = call_delta(
        call_chunk(0, "{", "bash")["choices"][0]["delta"]["tool_calls"][0], None, begun
    )
    assert (first.key, first.starts, first.id, first.name, first.arguments) == (
        "call:0",
        True,
        "call_0",
        "bash",
        "{",
    )
    more = call_delta({"index": 0, "function": {"arguments": "}"}}, first.key, begun)
    assert not more.starts and more.arguments == "}"
    with pytest.raises(DialectError) as err:
        call_delta({"index": 0, "function": {"arguments": "x"}}, "text", begun)
    assert err.value.status == 502


@pytest.mark.parametrize("writer", ["anthropic", "responses"])
def test_both_writers_refuse_a_call_that_resumes_after_another_block(writer):
    feed = (
        AnthropicStreamTranslator().feed
        if writer == "anthropic"
        else ResponseWriter({"model": "m"}).feed
    )
    feed(call_chunk(0, '{"a":', "bash"))
    feed(call_chunk(0, "1}"))  # still the open call: fine
    feed(call_chunk(1, "{}", "edit"))  # the next call
    with pytest.raises(DialectError, match="resumed"):
        feed(call_chunk(0, " "))
    other = (
        AnthropicStreamTranslator().feed
        if writer == "anthropic"
        else ResponseWriter({"model": "m"}).feed
    )
    other(call_chunk(0, "{", "bash"))
    other(TEXT)
    with pytest.raises(DialectError, match="resumed"):
        other(call_chunk(0, "}"))
