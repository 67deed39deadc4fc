"""The one table of how the gateway answers an exception: status, error kind and code,
what the client reads, and a ``retry-after`` header, rendered in the shape of the
endpoint's API (``Dialect.error_body``; OpenAI's for the session endpoints).

What is not in the table is a bug: a 500 with a request id, logged with its traceback.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fastapi.responses import JSONResponse

from gateway.dialects.errors import DialectError, upstream_refusal
from gateway.identity import UnknownApiKey
from gateway.steps.admit import QuotaExceeded
from gateway.upstream import UpstreamError
from router import NoHealthyReplica
from store import SessionTooLarge, StoreUnavailable

log = logging.getLogger("foldgate")

RETRY_AFTER_S = 2


def own_retry_after(exc: Any) -> int:
    """The exception's own ``retry_after_s`` (a quota window's turn, the breakers' next trial)."""
    return int(exc.retry_after_s)


def fixed_retry_after(exc: Any) -> int:
    return RETRY_AFTER_S


@dataclass(frozen=True, slots=True)
class ErrorRule:
    """How one exception type is answered. ``status`` None: the error says itself (a
    ``DialectError``'s own fields; an upstream's refusal from its status and body).
    ``message`` None: the exception's text. ``logged``: the warning it is logged under
    (with its text, which may name internal addresses the client must not see)."""

    status: int | None = None
    kind: str = "invalid_request_error"
    code: str | None = None
    message: str | None = None
    retry_after: Callable[[Any], int] | None = None
    logged: str | None = None

    def error(self, exc: Exception) -> DialectError:
        if self.logged is not None:
            log.warning("%s: %s", self.logged, exc)
        if self.status is not None:
            message = self.message if self.message is not None else str(exc)
            return DialectError(message, status=self.status, kind=self.kind, code=self.code)
        if isinstance(exc, UpstreamError):
            return upstream_refusal(exc.status, exc.body)
        assert isinstance(exc, DialectError), f"no status for {type(exc).__name__}"
        return exc


ErrorTable = Mapping[type[Exception], ErrorRule]

ERRORS: ErrorTable = {
    DialectError: ErrorRule(),
    UnknownApiKey: ErrorRule(401, "authentication_error"),
    QuotaExceeded: ErrorRule(
        429, "rate_limit_error", "rate_limit_exceeded", retry_after=own_retry_after
    ),
    SessionTooLarge: ErrorRule(413, "request_too_large"),
    StoreUnavailable: ErrorRule(
        503,
        "overloaded_error",
        message="session store unavailable, retry",
        retry_after=fixed_retry_after,
        logged="store unavailable",
    ),
    NoHealthyReplica: ErrorRule(
        503,
        "overloaded_error",
        message="no model server available, retry",
        retry_after=own_retry_after,
        logged="no replica",
    ),
    UpstreamError: ErrorRule(logged="upstream refused"),
}


def rule_for(exc: Exception, table: ErrorTable) -> ErrorRule | None:
    """The rule of the nearest of the exception's classes the table names."""
    for cls in type(exc).__mro__:
        rule = table.get(cls)
        if rule is not None:
            return rule
    return None


def error_response(
    exc: Exception,
    error_body: Callable[[DialectError], dict[str, Any]],
    *,
    table: ErrorTable = ERRORS,
    where: str = "",
) -> JSONResponse:
    """``exc`` answered as ``table`` says, in ``error_body``'s shape; a 500 when the table
    does not name it."""
    rule = rule_for(exc, table)
    if rule is None:
        request_id = uuid.uuid4().hex
        log.error("unexpected error on %s (request %s)", where, request_id, exc_info=exc)
        err = DialectError(
            f"internal error (request id {request_id})", status=500, kind="api_error"
        )
        return JSONResponse(error_body(err), status_code=500, headers={"x-request-id": request_id})
    err = rule.error(exc)
    headers = {"retry-after": str(rule.retry_after(exc))} if rule.retry_after else None
    return JSONResponse(error_body(err), status_code=err.status, headers=headers)
