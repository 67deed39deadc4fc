"""The gateway's error as a client reads it, and the upstream failures turned into one.

A ``DialectError`` carries a kind (one of ``ERROR_KINDS``), an HTTP status and a message a
client may read; each dialect writes it in its API's error shape (``Dialect.error_body``),
naming the kind with its own table of error types. Upstream failures arrive here as plain
values (the replica's status and error body), so this package knows nothing of the
upstream client.
"""

from __future__ import annotations

import logging
from typing import Any, Literal, get_args

log = logging.getLogger("foldgate")

ErrorKind = Literal[
    "invalid_request_error",
    "authentication_error",
    "not_found_error",
    "timeout_error",
    "request_too_large",
    "rate_limit_error",
    "api_error",
    "overloaded_error",
]
ERROR_KINDS: tuple[ErrorKind, ...] = get_args(ErrorKind)
"""Every kind of error the gateway answers with; every dialect names each one."""


class DialectError(Exception):
    """A request the gateway refuses, or a failure it reports, in words a client may read.

    ``param`` is the JSON path of the offending field (``messages[3].role``), so a client can
    find the problem; ``status`` is the HTTP status the gateway should answer with; ``code``
    the machine-readable code OpenAI clients act on (``context_length_exceeded``).
    """

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        status: int = 400,
        kind: ErrorKind = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        if kind not in ERROR_KINDS:  # a dialect would have no name for it
            raise ValueError(f"unknown error kind {kind!r}; expected one of {ERROR_KINDS}")
        super().__init__(f"{param}: {message}" if param else message)
        self.message = message
        self.param = param
        self.status = status
        self.kind: ErrorKind = kind
        self.code = code


def too_large(message: str, *, param: str | None = None) -> DialectError:
    """A body over the gateway's limits (HTTP 413, as both providers answer)."""
    return DialectError(message, param=param, status=413, kind="request_too_large")


def upstream_refusal(status: int | None, body: Any) -> DialectError:
    """An upstream's refusal before any chunk (a 4xx such as context too long; anything else
    is a 502), from the replica's status and error body; the replica's own error code is
    kept."""
    detail = _error_detail(body)
    answer = status if status and 400 <= status < 500 else 502
    kind: ErrorKind = "invalid_request_error" if answer < 500 else "api_error"
    code = detail.get("code") if isinstance(detail, dict) else None
    message = upstream_message(status, body)
    if not isinstance(code, str):
        code = refusal_code(answer, message)
    return DialectError(f"upstream: {message}", status=answer, kind=kind, code=code)


def upstream_broke_off(status: int | None, body: Any) -> DialectError:
    """An upstream failure after the reply began, as the error its stream ends with
    (``mid_stream_error``)."""
    message = upstream_message(status, body)
    return DialectError(message, status=502, kind="api_error", code=refusal_code(status, message))


def mid_stream_error(exc: Exception) -> DialectError:
    """The error event that ends a stream whose status line is already sent. A
    ``DialectError`` keeps its message and code; anything else is a bug, logged here with
    its traceback."""
    if isinstance(exc, DialectError):
        message, code = exc.message, exc.code
    else:
        log.error("stream failed", exc_info=exc)
        message, code = "internal error", None
    return DialectError(
        f"upstream failed mid-stream: {message}", status=502, kind="api_error", code=code
    )


def upstream_message(status: int | None, body: Any) -> str:
    """What a client may read of an upstream failure: the replica's own error message when
    it sent one, else the kind of failure; never the upstream error's text, which names the
    replica."""
    detail = _error_detail(body)
    message = detail.get("message") if isinstance(detail, dict) else detail
    if isinstance(message, str) and message.strip():
        return message
    if status and status != 502:
        return f"the model server answered HTTP {status}"
    return "the model server failed or stopped answering"


def refusal_code(status: int | None, message: str) -> str | None:
    """The OpenAI error code clients act on for an upstream refusal: they compact on
    ``context_length_exceeded`` and back off on ``rate_limit_exceeded``."""
    if status == 429:
        return "rate_limit_exceeded"
    if status == 400 and "context length" in message.lower():
        return "context_length_exceeded"
    return None


def _error_detail(body: Any) -> Any:
    """The ``error`` member of an OpenAI-shaped error body (what vLLM sends), else the body."""
    return body.get("error", body) if isinstance(body, dict) else body
