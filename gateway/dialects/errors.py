"""Errors for bad request bodies, and the JSON error shapes each provider answers with."""

from __future__ import annotations

from typing import Any


class DialectError(Exception):
    """A request body that does not parse in its dialect.

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
        kind: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        super().__init__(f"{param}: {message}" if param else message)
        self.message = message
        self.param = param
        self.status = status
        self.kind = kind
        self.code = code


def too_large(message: str, *, param: str | None = None) -> DialectError:
    """A body over the gateway's limits (HTTP 413, as both providers answer)."""
    return DialectError(message, param=param, status=413, kind="request_too_large")


def openai_error_body(err: DialectError) -> dict[str, Any]:
    """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    return {
        "error": {
            "message": str(err),
            "type": err.kind,
            "param": err.param,
            "code": err.code,
        }
    }


def anthropic_error_body(err: DialectError) -> dict[str, Any]:
    """Anthropic's error shape: ``{"type": "error", "error": {"type", "message"}}``."""
    return {"type": "error", "error": {"type": err.kind, "message": str(err)}}
