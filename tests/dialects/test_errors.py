import pytest

from gateway.dialects import anthropic_messages, openai_chat
from gateway.dialects.errors import DialectError, anthropic_error_body, openai_error_body, too_large


def test_error_bodies_have_each_providers_shape() -> None:
    with pytest.raises(DialectError) as info:
        openai_chat.decode_request({"model": "m", "messages": [{"role": "bot", "content": "x"}]})
    err = info.value
    assert openai_error_body(err) == {
        "error": {
            "message": "messages[0].role: unknown role 'bot'; expected one of system, developer, "
            "user, assistant, tool",
            "type": "invalid_request_error",
            "param": "messages[0].role",
            "code": None,
        }
    }
    assert anthropic_error_body(err) == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": openai_error_body(err)["error"]["message"],
        },
    }


def test_too_large_is_a_413() -> None:
    err = too_large("body is 40 MB; the limit is 32 MB")
    assert (err.status, err.kind, err.param) == (413, "request_too_large", None)
    assert anthropic_error_body(err)["error"]["type"] == "request_too_large"


def test_missing_max_tokens_is_named() -> None:
    with pytest.raises(DialectError) as info:
        anthropic_messages.decode_request(
            {"model": "m", "messages": [{"role": "user", "content": "x"}]}
        )
    assert (info.value.param, info.value.message) == (
        "max_tokens",
        "missing required field 'max_tokens'",
    )
