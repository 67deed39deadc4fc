"""The error table: each exception the request path raises is answered with its status,
error kind, code and retry-after, in the shape of the endpoint's API; anything else is a
500 with a request id, and a subclass is answered as the class the table names."""

from __future__ import annotations

import logging

import orjson
import pytest

from gateway.dialects import DIALECTS
from gateway.dialects.errors import DialectError
from gateway.dialects.openai_chat import openai_error_body
from gateway.http_errors import error_response
from gateway.identity import UnknownApiKey
from gateway.steps.admit import QuotaExceeded
from gateway.upstream import UpstreamError
from router import NoHealthyReplica
from store import Refusal, SessionTooLarge, StoreUnavailable

CASES = [
    # exception, status, kind, code, retry-after
    (DialectError("bad", param="x", code="c"), 400, "invalid_request_error", "c", None),
    (UnknownApiKey("invalid or missing API key"), 401, "authentication_error", None, None),
    (
        QuotaExceeded("t", Refusal("requests", 5, 5), retry_after_s=7),
        429,
        "rate_limit_error",
        "rate_limit_exceeded",
        "7",
    ),
    (SessionTooLarge("over the cap"), 413, "request_too_large", None, None),
    (StoreUnavailable("redis at 10.0.0.5 down"), 503, "overloaded_error", None, "2"),
    (NoHealthyReplica("http://10.0.0.7 down", retry_after_s=4), 503, "overloaded_error", None, "4"),
    (
        UpstreamError("refused", retryable=False, status=400, body={"error": {"code": "u"}}),
        400,
        "invalid_request_error",
        "u",
        None,
    ),
]


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.name)
@pytest.mark.parametrize(("exc", "status", "kind", "code", "retry"), CASES)
def test_each_exception_has_its_status_and_headers_in_the_dialects_shape(
    dialect, exc, status, kind, code, retry
) -> None:
    resp = error_response(exc, dialect.error_body)
    assert resp.status_code == status
    assert resp.headers.get("retry-after") == retry
    body = orjson.loads(resp.body)
    expected = dialect.error_body(DialectError("?", status=status, kind=kind, code=code))
    assert body.keys() == expected.keys()
    assert kind in resp.body.decode()
    if code is not None and "code" in expected.get("error", {}):
        assert body["error"]["code"] == code
    # The internal addresses in the exception's text are for the log only.
    assert "10.0.0." not in resp.body.decode()


def test_an_exception_the_table_does_not_name_is_a_500_with_a_logged_request_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR):
        resp = error_response(RuntimeError("a bug"), openai_error_body, where="/x")
    assert resp.status_code == 500
    request_id = resp.headers["x-request-id"]
    assert request_id in resp.body.decode() and "a bug" not in resp.body.decode()
    assert any(request_id in r.getMessage() and r.exc_info for r in caplog.records)


def test_a_subclass_is_answered_as_the_class_the_table_names() -> None:
    class Gone(StoreUnavailable):
        pass

    resp = error_response(Gone("down"), openai_error_body)
    assert (resp.status_code, resp.headers["retry-after"]) == (503, "2")
