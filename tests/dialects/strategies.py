"""Hypothesis strategies for valid request bodies of each dialect.

Valid means: what the providers accept (roles, content shapes, tool results answering an
earlier call), with the variety real clients send: string vs list content, images,
unknown fields, thinking with signatures, cache_control, null fields from SDK model dumps.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

texts = st.text(max_size=12)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False)
    | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
json_objects = st.dictionaries(st.text(max_size=6), json_values, max_size=3)


def unknown_fields(names: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(st.sampled_from(names), json_values, max_size=2)


class _Ids:
    """Hands out call ids that are unique within one body."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.count = 0

    def new(self) -> str:
        self.count += 1
        return f"{self.prefix}{self.count}"


# --- OpenAI Chat Completions -----------------------------------------------------------

_openai_text_part = st.builds(
    lambda text, extra: {**extra, "type": "text", "text": text},
    texts,
    unknown_fields(["cache_control", "x_note"]),
)
_openai_other_part = st.sampled_from(
    [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "low"}},
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
        {"type": "brand_new_part", "payload": [1, 2]},
    ]
)
_openai_text_content = texts | st.lists(_openai_text_part, max_size=3)
_openai_user_content = texts | st.lists(_openai_text_part | _openai_other_part, max_size=3)


@st.composite
def _openai_tool_call(draw: st.DrawFn, ids: _Ids) -> dict[str, Any]:
    fn = {
        **draw(unknown_fields(["x_fn"])),
        "name": draw(st.sampled_from(["bash", "read_file", "edit"])),
        "arguments": draw(st.sampled_from(['{"cmd": "ls"}', "{}", '{"a": [1, 2]}', '{"bad'])),
    }
    call = {**draw(unknown_fields(["index", "x_call"])), "id": ids.new(), "function": fn}
    if draw(st.booleans()):
        call["type"] = "function"
    return call


@st.composite
def _openai_assistant(draw: st.DrawFn, ids: _Ids) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant"}
    content = draw(st.sampled_from(["absent", "null", "value"]))
    if content == "null":
        msg["content"] = None
    elif content == "value":
        msg["content"] = draw(_openai_text_content)
    thinking = draw(st.sampled_from(["", "reasoning_content", "reasoning", "both", "null"]))
    if thinking in ("reasoning_content", "reasoning"):
        msg[thinking] = draw(texts)
    elif thinking == "both":
        msg["reasoning_content"] = msg["reasoning"] = draw(texts)
    elif thinking == "null":
        msg["reasoning_content"] = None
    calls = draw(st.sampled_from(["absent", "null", "empty", "some"]))
    if calls == "null":
        msg["tool_calls"] = None
    elif calls == "empty":
        msg["tool_calls"] = []
    elif calls == "some":
        msg["tool_calls"] = draw(st.lists(_openai_tool_call(ids), min_size=1, max_size=3))
    # What SDK model dumps carry along.
    msg.update(draw(unknown_fields(["name", "refusal", "annotations", "audio"])))
    if draw(st.booleans()):
        msg["function_call"] = None
    return msg


@st.composite
def openai_bodies(draw: st.DrawFn, *, max_tokens: bool = False) -> dict[str, Any]:
    ids = _Ids(draw(st.sampled_from(["call_", "chatcmpl-tool-", "toolu_"])))
    issued: list[str] = []
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        role = draw(st.sampled_from(["system", "developer"]))
        messages.append({"role": role, "content": draw(_openai_text_content)})
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["user", "assistant", "system"]))
        if kind == "user":
            msg = {"role": "user", "content": draw(_openai_user_content)}
            messages.append({**msg, **draw(unknown_fields(["name"]))})
        elif kind == "system":
            messages.append({"role": "system", "content": draw(_openai_text_content)})
        else:
            msg = draw(_openai_assistant(ids))
            messages.append(msg)
            issued += [c["id"] for c in msg.get("tool_calls") or ()]
            for call_id in draw(st.lists(st.sampled_from(issued), max_size=3)) if issued else ():
                result = {"role": "tool", "tool_call_id": call_id}
                result["content"] = draw(_openai_text_content)
                messages.append({**result, **draw(unknown_fields(["name"]))})
    body: dict[str, Any] = {"model": draw(st.sampled_from(["tiny", "gpt-4o", "qwen3.6-27b"]))}
    body["messages"] = messages
    if max_tokens or draw(st.booleans()):
        body["max_tokens"] = draw(st.integers(1, 4096))
    tools = draw(
        st.lists(
            st.builds(
                lambda name, desc: {
                    "type": "function",
                    "function": {
                        "name": name,
                        "description": desc,
                        "parameters": {"type": "object"},
                    },
                },
                st.sampled_from(["bash", "read_file"]),
                texts,
            ),
            max_size=2,
        )
        | st.none()
    )
    if tools is not None:
        body["tools"] = tools
    body.update(
        draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "stream": st.booleans(),
                    "temperature": st.floats(0, 2),
                    "stop": st.sampled_from(["\n", ["END", "STOP"]]),
                    "tool_choice": st.sampled_from(
                        [
                            "auto",
                            "required",
                            "none",
                            {"type": "function", "function": {"name": "bash"}},
                        ]
                    ),
                    "parallel_tool_calls": st.booleans(),
                    "user": texts,
                    "prompt_cache_key": texts,
                    "chat_template_kwargs": json_objects,
                },
            )
        )
    )
    return body


# --- Anthropic Messages ----------------------------------------------------------------

_cache_control = st.just({"type": "ephemeral"}) | st.just({"type": "ephemeral", "ttl": "1h"})
_anthropic_text_block = st.builds(
    lambda text, extra: {"type": "text", "text": text, **extra},
    texts,
    st.fixed_dictionaries(
        {}, optional={"cache_control": _cache_control, "citations": st.just([]) | st.none()}
    ),
)
_anthropic_media_block = st.sampled_from(
    [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "d"}},
        {"type": "search_result", "source": "s", "title": "t", "content": []},
        {"type": "brand_new_block", "x": {"y": 1}},
    ]
)
_anthropic_result_content = st.lists(
    _anthropic_text_block
    | st.sampled_from([{"type": "image", "source": {"type": "url", "url": "u"}}]),
    max_size=2,
)


@st.composite
def _tool_result(draw: st.DrawFn, call_id: str) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": call_id}
    content = draw(st.sampled_from(["absent", "str", "list"]))
    if content == "str":
        block["content"] = draw(texts)
    elif content == "list":
        block["content"] = draw(_anthropic_result_content)
    error = draw(st.sampled_from([None, True, False]))
    if error is not None:
        block["is_error"] = error
    if draw(st.booleans()):
        block["cache_control"] = draw(_cache_control)
    return block


@st.composite
def _assistant_blocks(draw: st.DrawFn, ids: _Ids) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["text", "thinking", "redacted", "tool_use", "server"]))
        if kind == "text":
            blocks.append(draw(_anthropic_text_block))
        elif kind == "thinking":
            block = {"type": "thinking", "thinking": draw(texts), "signature": draw(texts)}
            blocks.append(block)
        elif kind == "redacted":
            blocks.append({"type": "redacted_thinking", "data": draw(texts)})
        elif kind == "tool_use":
            block = {
                "type": "tool_use",
                "id": ids.new(),
                "name": "bash",
                "input": draw(json_objects),
            }
            if draw(st.booleans()):
                block["cache_control"] = draw(_cache_control)
            blocks.append(block)
        else:
            blocks.append(
                {"type": "server_tool_use", "id": ids.new(), "name": "web_search", "input": {}}
            )
    return blocks


@st.composite
def anthropic_bodies(draw: st.DrawFn) -> dict[str, Any]:
    ids = _Ids(draw(st.sampled_from(["toolu_", "call_"])))
    pending: list[str] = []
    messages: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(1, 6))):
        if draw(st.booleans()):
            blocks = draw(_assistant_blocks(ids))
            pending += [b["id"] for b in blocks if b["type"] == "tool_use"]
            content: Any = draw(texts) if not blocks and draw(st.booleans()) else blocks
            messages.append({"role": "assistant", "content": content})
            continue
        others = draw(st.lists(_anthropic_text_block | _anthropic_media_block, max_size=3))
        answered = draw(st.lists(st.sampled_from(pending), max_size=3)) if pending else []
        blocks = [draw(_tool_result(call_id)) for call_id in answered]
        # Interleave the tool results with the other blocks at random positions.
        for block in others:
            blocks.insert(draw(st.integers(0, len(blocks))), block)
        content = draw(texts) if not blocks and draw(st.booleans()) else blocks
        messages.append({"role": "user", "content": content})
    body: dict[str, Any] = {
        "model": draw(st.sampled_from(["claude-sonnet-4-5", "tiny"])),
        "max_tokens": draw(st.integers(1, 64000)),
        "messages": messages,
    }
    system = draw(st.none() | texts | st.lists(_anthropic_text_block, max_size=3))
    if system is not None:
        body["system"] = system
    tools = draw(
        st.none()
        | st.lists(
            st.sampled_from(
                [
                    {"name": "bash", "description": "run", "input_schema": {"type": "object"}},
                    {
                        "name": "edit",
                        "input_schema": {"type": "object"},
                        "cache_control": {"type": "ephemeral"},
                    },
                    {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
                ]
            ),
            max_size=3,
        )
    )
    if tools is not None:
        body["tools"] = tools
    body.update(
        draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "stream": st.booleans(),
                    "temperature": st.floats(0, 1),
                    "top_k": st.integers(1, 50),
                    "stop_sequences": st.lists(texts, max_size=2),
                    "metadata": st.fixed_dictionaries({"user_id": texts}),
                    "thinking": st.just({"type": "enabled", "budget_tokens": 1024}),
                    "tool_choice": st.sampled_from(
                        [{"type": "auto"}, {"type": "any"}, {"type": "tool", "name": "bash"}]
                    ),
                    "x_unknown": json_values,
                },
            )
        )
    )
    return body


# --- OpenAI Responses -----------------------------------------------------------------

_responses_text_part = st.builds(
    lambda kind, text, extra: {**extra, "type": kind, "text": text},
    st.sampled_from(["input_text", "output_text"]),
    texts,
    unknown_fields(["annotations", "cache_control"]),
)
_responses_content = texts | st.lists(_responses_text_part, max_size=2)
_reasoning_item = st.builds(
    lambda summary, content, extra: {
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": t} for t in summary],
        **(
            {"content": [{"type": "reasoning_text", "text": t} for t in content]} if content else {}
        ),
        **extra,
    },
    st.lists(texts, max_size=2),
    st.lists(texts, max_size=2),
    unknown_fields(["id", "encrypted_content"]),
)


@st.composite
def _responses_turn(draw: st.DrawFn, ids: _Ids) -> list[dict[str, Any]]:
    """One model turn's items (reasoning, text, calls) and the outputs answering its calls."""
    items: list[dict[str, Any]] = []
    if draw(st.booleans()):
        items.append(draw(_reasoning_item))
    if draw(st.booleans()):
        content = draw(st.lists(_responses_text_part, min_size=1, max_size=2))
        items.append({"type": "message", "role": "assistant", "content": content})
    calls = [ids.new() for _ in range(draw(st.integers(0, 2)))]
    for call_id in calls:
        extra = draw(unknown_fields(["id", "status"]))
        items.append(
            {
                "type": "function_call",
                "call_id": call_id,
                "name": "bash",
                "arguments": "{}",
                **extra,
            }
        )
    for call_id in calls:
        output = draw(_responses_content)
        items.append({"type": "function_call_output", "call_id": call_id, "output": output})
    return items


@st.composite
def responses_bodies(draw: st.DrawFn) -> dict[str, Any]:
    """A Responses request as Codex or an SDK user sends it (the whole input)."""
    ids = _Ids("call_")
    items: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(1, 4))):
        role = draw(st.sampled_from(["user", "developer", "system"]))
        items.append({"type": "message", "role": role, "content": draw(_responses_content)})
        items.extend(draw(_responses_turn(ids)))
    body: dict[str, Any] = {"model": "m", "input": items}
    if draw(st.booleans()):
        body["instructions"] = draw(texts)
    if draw(st.booleans()):
        body["tools"] = [{"type": "function", "name": "bash", "parameters": {}}]
    return body
