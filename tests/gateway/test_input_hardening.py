"""Hostile input: strict field types, nesting depth, session ids, what is echoed back, and
the last-resort handler. Every refusal is a 4xx in the dialect's shape that stores nothing."""

from __future__ import annotations

import json

import pytest

from gateway.config import GatewayConfig
from gateway.dialects.errors import DialectError
from gateway.dialects.fields import within_depth
from gateway.exposure import ReplicaLabels, header_value
from gateway.identity import MAX_SESSION_ID_CHARS, resolve_session, session_id
from gateway.pipeline import Pipeline
from gateway.steps.decode import MAX_JSON_DEPTH
from gateway.transcript import Transcript, text_message
from loadtests.fake_upstream import ScriptedReply
from tests.gateway.conftest import store_at

CHAT = ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "x"}]})
MESSAGES = (
    "/v1/messages",
    {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]},
)
RESPONSES = ("/v1/responses", {"model": "m", "input": "x"})

# (route, base body, field, bad value): each must be a 400 naming the field.
BAD_FIELDS = [
    *(
        (*CHAT, field, value)
        for field, value in [
            ("stream", "false"),
            ("stream", 0),
            ("max_tokens", -1),
            ("max_tokens", "8"),
            ("max_tokens", 1e308),
            ("max_tokens", 8.0),
            ("max_tokens", True),
            ("max_completion_tokens", 0),
            ("n", 2),
            ("temperature", "hot"),
            ("temperature", -0.5),
            ("top_p", 1.5),
            ("stop", [1]),
            ("user", 5),
            ("prompt_cache_key", ["a"]),
            ("metadata", "m"),
            ("stream_options", True),
        ]
    ),
    *(
        (*MESSAGES, field, value)
        for field, value in [
            ("stream", "false"),
            ("max_tokens", -1),
            ("max_tokens", "8"),
            ("max_tokens", 1e308),
            ("max_tokens", None),
            ("temperature", "0.5"),
            ("top_k", -1),
            ("stop_sequences", "END"),
            ("metadata", []),
            ("tool_choice", "auto"),
            ("tool_choice", {"type": ["auto"]}),
            ("tool_choice", {"type": "tool"}),
        ]
    ),
    *(
        (*RESPONSES, field, value)
        for field, value in [
            ("stream", "false"),
            ("store", "no"),
            ("max_output_tokens", -1),
            ("max_output_tokens", "8"),
            ("max_output_tokens", 1e308),
            ("temperature", []),
            ("top_p", -1),
            ("prompt_cache_key", 1),
        ]
    ),
]


def error_of(route: str, payload: dict) -> dict:
    """The error object of either shape, after checking the shape."""
    if route == "/v1/messages":
        assert payload["type"] == "error" and set(payload["error"]) == {"type", "message"}
        return payload["error"]
    assert set(payload["error"]) == {"message", "type", "param", "code"}
    return payload["error"]


async def test_fields_the_gateway_reads_are_typed(gateway_with_fake, client, store_url):
    async with gateway_with_fake() as (url, fake):
        for route, base, field, value in BAD_FIELDS:
            resp = await client.post(f"{url}{route}", json={**base, field: value})
            assert resp.status_code == 400, (route, field, value, resp.text)
            assert field in error_of(route, resp.json())["message"], (route, field)
        # ...while the same fields with good values pass, null standing for absent.
        for route, base in (CHAT, MESSAGES, RESPONSES):
            good = {**base, "stream": False, "temperature": 0.5, "top_p": None}
            resp = await client.post(f"{url}{route}", json=good, headers={"x-session-id": route})
            assert resp.status_code == 200, (route, resp.text)
        assert len(fake.requests) == 3
    async with store_at(store_url) as store:
        assert len(await store.list_sessions("default")) == 3


def nested(depth: int) -> object:
    value: object = "leaf"
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


class Deep:
    """JSON nested ``depth`` levels, written as text (``json`` cannot write that deep)."""

    def __init__(self, depth: int) -> None:
        self.depth = depth

    def text(self) -> str:
        opens = "".join('{"k":' if i % 2 == 0 else "[" for i in reversed(range(self.depth)))
        closes = "".join("}" if i % 2 == 0 else "]" for i in range(self.depth))
        return f'{opens}"leaf"{closes}'


def as_json(value: object) -> str:
    """``json.dumps`` that writes ``Deep`` values as their text."""
    marks: dict[str, str] = {}

    def mark(deep: Deep) -> str:
        key = f"@@deep{len(marks)}@@"
        marks[f'"{key}"'] = deep.text()
        return key

    text = json.dumps(value, default=mark)
    for key, deep in marks.items():
        text = text.replace(key, deep)
    return text


def test_depth_counts_arrays_and_objects():
    assert within_depth(nested(5), 5) and not within_depth(nested(6), 5)
    assert within_depth("x", 0) and within_depth({"a": 1, "b": [1, 2]}, 2)
    assert not within_depth({"a": 1, "b": [1, [2]]}, 2)


@pytest.mark.parametrize(("route", "base"), [CHAT, MESSAGES, RESPONSES], ids=lambda v: str(v))
async def test_deep_nesting_is_refused_before_anything_is_stored(
    gateway_with_fake, client, store_url, route, base
):
    # Places that once recursed: a tool input, an unknown field, metadata, a content part.
    tool_use = {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": None}}
    placements = {
        "unknown field": lambda b, v: {**b, "x_extra": v},
        "metadata": lambda b, v: {**b, "metadata": {"session_id": "s", "deep": v}},
        "tool input": lambda b, v: (
            {
                **b,
                "messages": [
                    {"role": "user", "content": "x"},
                    {"role": "assistant", "content": [{**tool_use, "input": {"a": v}}]},
                    {"role": "user", "content": "y"},
                ],
            }
            if route == "/v1/messages"
            else {**b, "x_extra": v}
        ),
    }
    async with gateway_with_fake() as (url, fake):
        for name, place in placements.items():
            for depth in (MAX_JSON_DEPTH, 300, 1000, 2000):
                body = as_json(place(base, Deep(depth)))
                resp = await client.post(f"{url}{route}", content=body)
                assert resp.status_code == 400, (name, depth, resp.text[:300])
                error_of(route, resp.json())
        assert fake.requests == []
        # Just under the limit passes the whole path: store, render, the upstream encoder.
        resp = await client.post(
            f"{url}{route}", json=placements["tool input"](base, nested(MAX_JSON_DEPTH - 8))
        )
        assert resp.status_code == 200, resp.text[:300]
        assert len(fake.requests) == 1
    async with store_at(store_url) as store:
        assert len(await store.list_sessions("default")) == 1


CONFIG = GatewayConfig()
TRANSCRIPT = Transcript((text_message("user", "task"),))


def test_session_ids_with_control_characters_are_refused():
    for bad in ("a\x00b", "a\r\nset-cookie: x", "a\x7fb", "a\x85b", "a\tb"):
        with pytest.raises(DialectError) as err:
            resolve_session({}, {"prompt_cache_key": bad}, "t", TRANSCRIPT, CONFIG)
        assert err.value.param == "prompt_cache_key"
    with pytest.raises(DialectError) as err:
        resolve_session({}, {"metadata": {"user_id": 7}}, "t", TRANSCRIPT, CONFIG)
    assert err.value.param == "metadata.user_id"
    # Blank ids name no session: the next source (here the digest) decides.
    assert resolve_session({}, {"prompt_cache_key": "  "}, "t", TRANSCRIPT, CONFIG).startswith(
        "auto-"
    )


def test_long_session_ids_are_hashed_not_truncated():
    shared = "x" * MAX_SESSION_ID_CHARS
    one, two = session_id(shared + "1", "s"), session_id(shared + "2", "s")
    assert one != two
    assert len(one) <= MAX_SESSION_ID_CHARS and one.startswith("x" * 100)
    assert session_id(shared + "1", "other source") == one
    assert session_id(shared, "s") == shared  # at the limit: kept as sent


def test_echoed_header_values_are_safe():
    assert header_value("run-42 (retry)") == "run-42 (retry)"
    for value in ("café", "セッション", "a\r\nb", "100%\x00"):
        echoed = header_value(value)
        assert echoed.isascii() and echoed.isprintable(), echoed
    assert header_value("café") == "caf%C3%A9"


def test_replica_labels_hide_addresses_unless_debug():
    labels = ReplicaLabels("secret")
    url = "http://10.1.2.3:8000"
    assert labels.label(url) == ReplicaLabels("secret").label(url) != url
    assert labels.label(url) != ReplicaLabels("other").label(url)
    assert labels.hide({"replica": url, "log": [{"replica": url, "n": 1}]}) == {
        "replica": labels.label(url),
        "log": [{"replica": labels.label(url), "n": 1}],
    }
    assert ReplicaLabels("secret", debug=True).label(url) == url


async def test_odd_session_ids_through_the_gateway(gateway_with_fake, client, store_url):
    route, base = CHAT
    async with gateway_with_fake() as (url, fake):
        resp = await client.post(f"{url}{route}", json={**base, "prompt_cache_key": "a\x00b"})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "prompt_cache_key"
        resp = await client.post(f"{url}{route}", json={**base, "prompt_cache_key": "a\r\nb: c"})
        assert resp.status_code == 400
        assert fake.requests == []
        resp = await client.post(f"{url}{route}", json={**base, "prompt_cache_key": "sesión ✓"})
        assert resp.status_code == 200
        assert resp.headers["x-foldgate-session"] == "sesi%C3%B3n %E2%9C%93"
        # The end user's id is not a session: two tasks of one user are two sessions.
        for task in ("task one", "task two"):
            body = {"model": "m", "user": "alice", "messages": [{"role": "user", "content": task}]}
            resp = await client.post(f"{url}{route}", json=body)
            assert resp.status_code == 200 and resp.headers["x-foldgate-session"] != "alice"
    async with store_at(store_url) as store:
        sessions = await store.list_sessions("default")
    assert "sesión ✓" in sessions and "alice" not in sessions and len(sessions) == 3


async def test_upstream_errors_do_not_name_the_replica(gateway_with_fake, client):
    refusal = ScriptedReply(status=500, error_message="boom")
    async with gateway_with_fake([refusal] * 3, max_attempts=1) as (url, fake):
        for route, base in (CHAT, MESSAGES, RESPONSES):
            resp = await client.post(f"{url}{route}", json=base)
            assert resp.status_code >= 500
            assert fake.url not in resp.text and "127.0.0.1" not in resp.text, resp.text
            error_of(route, resp.json())
        health = (await client.get(f"{url}/health")).text
        assert fake.url not in health and "127.0.0.1" not in health


async def test_an_unexpected_error_is_a_500_in_the_dialects_shape(
    gateway_with_fake, client, monkeypatch, caplog
):
    async def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(Pipeline, "decode", broken)
    async with gateway_with_fake() as (url, _fake):
        for route, base in (CHAT, MESSAGES, RESPONSES):
            resp = await client.post(f"{url}{route}", json=base)
            assert resp.status_code == 500
            request_id = resp.headers["x-request-id"]
            assert request_id in error_of(route, resp.json())["message"]
            assert "a bug" not in resp.text
            assert any(request_id in r.getMessage() and r.exc_info for r in caplog.records), (
                "logged with its request id and traceback"
            )
    json.dumps(BAD_FIELDS)  # the table is plain JSON (sent as bodies above)
