from typing import Any

from hypothesis import HealthCheck, given, settings

from gateway.dialects import anthropic_messages, openai_chat
from gateway.dialects.volatile import without_volatile
from tests.dialects.strategies import anthropic_bodies, openai_bodies

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

EPHEMERAL = {"type": "ephemeral"}


def _request(turns: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": "claude", "max_tokens": 9, "messages": turns}


def test_moving_cache_control_does_not_change_stable_messages() -> None:
    call = {"type": "tool_use", "id": "t1", "name": "Bash", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "t1", "content": "out"}
    image = {"type": "image", "source": {"type": "url", "url": "u"}}
    first = _request(
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": "go", "cache_control": EPHEMERAL}],
            },
            {"role": "assistant", "content": [call]},
            {
                "role": "user",
                "content": [
                    {**result, "cache_control": EPHEMERAL},
                    {**image, "cache_control": EPHEMERAL},
                ],
            },
        ]
    )
    # Next turn the client moved the marker to its newest block.
    second = _request(
        [
            {"role": "user", "content": [{"type": "text", "text": "go"}]},
            {"role": "assistant", "content": [call]},
            {"role": "user", "content": [result, image]},
            {
                "role": "assistant",
                "content": [{"type": "text", "text": "ok", "cache_control": EPHEMERAL}],
            },
        ]
    )
    a = anthropic_messages.decode_request(first).messages
    b = anthropic_messages.decode_request(second).messages
    assert a != b[: len(a)]  # the raw hints differ ...
    assert [without_volatile(m) for m in a] == [without_volatile(m) for m in b[: len(a)]]
    assert without_volatile(b[-1]).parts[0].meta == {}


def test_other_hints_survive() -> None:
    body = _request(
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "x", "citations": [], "cache_control": EPHEMERAL}
                ],
            }
        ]
    )
    (message,) = anthropic_messages.decode_request(body).messages
    assert without_volatile(message).parts[0].meta == {"anthropic": {"fields": {"citations": []}}}


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


@FAST
@given(anthropic_bodies())
def test_anthropic_body_without_volatile_is_the_body_without_markers(body: dict[str, Any]) -> None:
    t = anthropic_messages.decode_request(body)
    stable = t.with_messages(without_volatile(m) for m in t.messages)
    expected = {**body, "messages": _strip(body["messages"])}
    if "system" in body:
        expected["system"] = _strip(body["system"])
    assert anthropic_messages.encode_request(stable) == expected


@FAST
@given(openai_bodies())
def test_chat_body_without_volatile_is_the_body_without_markers(body: dict[str, Any]) -> None:
    t = openai_chat.decode_request(body)
    stable = t.with_messages(without_volatile(m) for m in t.messages)
    assert openai_chat.encode_request(stable) == {**body, "messages": _strip(body["messages"])}
