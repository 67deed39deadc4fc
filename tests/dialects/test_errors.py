import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from gateway.dialects import DIALECTS, anthropic_messages, openai_chat
from gateway.dialects.anthropic_messages import ANTHROPIC_ERROR_TYPES, anthropic_error_body
from gateway.dialects.base import Dialect, Exchange
from gateway.dialects.errors import (
    ERROR_KINDS,
    DialectError,
    ErrorKind,
    too_large,
    upstream_broke_off,
    upstream_refusal,
)
from gateway.dialects.fields import ANTHROPIC, OPENAI, RESPONSES
from gateway.dialects.openai_chat import OPENAI_ERROR_TYPES, openai_error_body
from gateway.dialects.openai_responses import OPENAI_RESPONSES


def openai_shape(err: DialectError) -> dict[str, Any]:
    error = {"message": str(err), "type": OPENAI_ERROR_TYPES[err.kind]}
    return {"error": {**error, "param": err.param, "code": err.code}}


def anthropic_shape(err: DialectError) -> dict[str, Any]:
    return {
        "type": "error",
        "error": {"type": ANTHROPIC_ERROR_TYPES[err.kind], "message": str(err)},
    }


# Each dialect's API's error shape; a new dialect fails these tests until it is named here.
SHAPES: dict[str, Callable[[DialectError], dict[str, Any]]] = {
    OPENAI: openai_shape,
    ANTHROPIC: anthropic_shape,
    RESPONSES: openai_shape,
}


def test_every_dialect_is_given_its_shape_here() -> None:
    assert sorted(d.name for d in DIALECTS) == sorted(SHAPES)


@pytest.mark.parametrize("types", [OPENAI_ERROR_TYPES, ANTHROPIC_ERROR_TYPES])
def test_each_error_table_names_every_kind(types: dict[ErrorKind, str]) -> None:
    assert sorted(types) == sorted(ERROR_KINDS)
    assert all(isinstance(name, str) and name for name in types.values())


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.name)
@pytest.mark.parametrize("kind", ERROR_KINDS)
def test_every_dialect_renders_every_kind_in_its_shape(dialect: Dialect, kind: ErrorKind) -> None:
    err = DialectError("went wrong", param="messages[2]", status=418, kind=kind, code="c")
    body = dialect.error_body(err)
    assert body == SHAPES[dialect.name](err)
    assert "messages[2]: went wrong" in json.dumps(body)


def test_an_unknown_kind_is_refused_where_it_is_made() -> None:
    with pytest.raises(ValueError, match="unknown error kind 'teapot_error'"):
        DialectError("x", kind="teapot_error")  # type: ignore[arg-type]


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


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (
            429,
            {"error": {"message": "slow down"}},
            (429, "invalid_request_error", "rate_limit_exceeded", "upstream: slow down"),
        ),
        (
            400,
            {"error": {"message": "This model's maximum context length is 8192 tokens"}},
            (400, "invalid_request_error", "context_length_exceeded", None),
        ),
        (
            400,
            {"error": {"message": "bad", "code": "replica_code"}},
            (400, "invalid_request_error", "replica_code", "upstream: bad"),
        ),
        (
            500,
            None,
            (502, "api_error", None, "upstream: the model server answered HTTP 500"),
        ),
        (
            502,
            "",
            (502, "api_error", None, "upstream: the model server failed or stopped answering"),
        ),
        (None, "plain text", (502, "api_error", None, "upstream: plain text")),
    ],
)
def test_an_upstream_refusal_keeps_its_status_and_code(
    status: int | None, body: Any, expected: tuple[Any, ...]
) -> None:
    err = upstream_refusal(status, body)
    message = expected[3] or err.message
    assert (err.status, err.kind, err.code, err.message) == (*expected[:3], message)


def test_an_upstream_failure_mid_stream_is_a_502_with_its_message() -> None:
    err = upstream_broke_off(502, {"error": {"message": "replica crashed"}})
    assert (err.status, err.kind, err.code, err.message) == (
        502,
        "api_error",
        None,
        "replica crashed",
    )
    assert upstream_broke_off(502, None).message == "the model server failed or stopped answering"


async def chunks_then(exc: Exception) -> AsyncIterator[dict[str, Any]]:
    yield {"id": "c", "model": "m", "choices": [{"index": 0, "delta": {"content": "par"}}]}
    raise exc


def last_error(frames: list[bytes]) -> dict[str, Any]:
    """The data of the stream's last frame (each dialect's error event)."""
    return json.loads(frames[-1].decode().split("data: ", 1)[1])


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.name)
@pytest.mark.parametrize(
    ("exc", "message"),
    [
        (upstream_broke_off(502, {"error": {"message": "replica crashed"}}), "replica crashed"),
        (RuntimeError("a bug naming http://replica-3:8000"), "internal error"),
    ],
)
async def test_a_stream_broken_off_ends_with_its_dialects_error_event(
    dialect: Dialect, exc: Exception, message: str
) -> None:
    body = {"model": "m"}
    frames = [f async for f in dialect.stream(chunks_then(exc), Exchange(body))]
    expected = f"upstream failed mid-stream: {message}"
    event = last_error(frames)
    if dialect.name == RESPONSES:
        assert event["type"] == "response.failed"
        assert event["response"]["error"] == {"code": "server_error", "message": expected}
    else:
        err = DialectError(expected, status=502, kind="api_error")
        assert event == SHAPES[dialect.name](err)
    assert "replica-3" not in b"".join(frames).decode()


async def test_a_refusal_code_mid_stream_reaches_the_responses_client() -> None:
    exc = upstream_broke_off(429, {"error": {"message": "slow down"}})
    frames = [f async for f in OPENAI_RESPONSES.stream(chunks_then(exc), Exchange({"model": "m"}))]
    assert last_error(frames)["response"]["error"]["code"] == "rate_limit_exceeded"
