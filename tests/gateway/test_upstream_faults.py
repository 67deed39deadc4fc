"""A faulty replica beside a healthy one: its faults are its failures, never the gateway's.

Each fault of the fake upstream (``ScriptedReply.breaks``: a dropped connection, an error
event, a ``data:`` line that is not JSON, a line cut mid-way; and a ``/v1/models`` that
answers 404) is tried with two replicas, the faulty one routed to first in turn:

- while nothing reached the client (before the first chunk, or anywhere in the reply of
  a client that waits for the whole reply) the request is retried on the healthy replica
  and the client gets its 200;
- once a stream has begun, it ends in the dialect's error event;
- with no healthy replica left, the client gets the dialect's error shape with a 502 or
  503, never a 500;
- the faulty replica's breaker opens after ``breaker_failures`` of them, and the store
  holds each turn once, retried or not.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from aiohttp import web

from gateway.config import DEFAULT_TENANT, GatewayConfig
from gateway.exposure import ReplicaLabels
from gateway.upstream import UpstreamClient, UpstreamError, parse_chunk
from loadtests.fake_upstream import FAKE_MODEL, FakeUpstream, ScriptedReply
from tests.gateway.conftest import running_gateway, store_at
from tests.gateway.test_faults import DIALECTS, SECRET, Dialect, counter, user

FAILURES = 3  # the breaker's failures in a row
REQUESTS = 2 * FAILURES + 1  # in turn: the faulty replica is tried first in all but one


@asynccontextmanager
async def faulty_beside_healthy(
    store_url: str,
    faulty: FakeUpstream,
    *,
    healthy: bool = True,
    policy: str = "round_robin",
    **overrides: Any,
) -> AsyncIterator[tuple[str, FakeUpstream | None]]:
    """A gateway over ``faulty`` and (``healthy``) a healthy fake, routed in turn (or by
    ``policy``)."""
    await faulty.start()
    good = await FakeUpstream().start() if healthy else None
    replicas = (faulty.url, good.url) if good else (faulty.url,)
    config = GatewayConfig(
        store_url=store_url,
        replicas=replicas,
        policy=policy,
        probe_interval_s=0.5,
        breaker_failures=FAILURES,
        breaker_open_s=30.0,
        cache_salt_secret=SECRET,
        **overrides,
    )
    try:
        async with running_gateway(config) as url:
            yield url, good
    finally:
        await faulty.stop()
        if good is not None:
            await good.stop()


def body(dialect: Dialect, text: str, stream: bool) -> dict[str, Any]:
    return {**dialect.body([user(text)]), "stream": stream}


async def streamed(client: httpx.AsyncClient, url: str, payload: dict[str, Any], session: str):
    """The status and the JSON of each ``data:`` line of a streamed reply."""
    async with client.stream("POST", url, json=payload, headers={"x-session-id": session}) as resp:
        lines = [line async for line in resp.aiter_lines()]
    events = [
        json.loads(line[5:]) for line in lines if line.startswith("data:") and "[DONE]" not in line
    ]
    return resp.status_code, events


async def breaker(client: httpx.AsyncClient, url: str, replica: str) -> tuple[float, float]:
    """The replica's breaker state (2: open) and how often it opened."""
    metrics = (await client.get(f"{url}/metrics")).text
    state = {"replica": ReplicaLabels(SECRET).label(replica)}  # /metrics shows no URL
    return (
        counter(metrics, "foldgate_router_breaker_state", state),
        counter(metrics, "foldgate_router_breaker_opened_total", state) or 0,
    )


async def assert_stored_once(store_url: str, texts: dict[str, str]) -> None:
    """Each session holds its one user turn once, on its first branch."""
    async with store_at(store_url) as store:
        for session, text in texts.items():
            stored = await store.load(DEFAULT_TENANT, session)
            assert stored.branch_id == 0, session
            assert [(m["role"], m["parts"][0]["text"]) for m in stored.messages] == [
                ("user", text)
            ], session


def error_of(dialect: Dialect, payload: dict[str, Any]) -> dict[str, Any]:
    """The error object of a dialect's error body (its shape checked)."""
    return dialect.error(payload)


def stream_error(dialect: Dialect, events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The error object of the event that ends a stream, in the dialect's shape; None when
    the stream ended as it should."""
    last = events[-1]
    if dialect.path == "/v1/responses":
        return last["response"]["error"] if last["type"] == "response.failed" else None
    if "error" not in last:
        return None
    return dialect.error(last)


# --- a reply that breaks while nothing reached the client: retried -----------------------

# (fault, chunks before it, streaming client): every case where the client has seen nothing
RETRIED = [
    ("not_json", 0, True),
    ("cut_line", 0, True),
    ("error", 0, True),
    ("not_json", 0, False),
    ("not_json", 1, False),  # after the first chunk: the whole reply is read before answering
    ("cut_line", 1, False),
    ("drop", 1, False),
    ("drop", 3, False),
    ("error", 1, False),
]


@pytest.mark.parametrize(("fault", "after", "stream"), RETRIED)
async def test_a_fault_before_anything_reached_the_client_is_retried_on_the_healthy_replica(
    store_url: str, client: httpx.AsyncClient, fault: str, after: int, stream: bool
) -> None:
    faulty = FakeUpstream(default=ScriptedReply("a longer reply", breaks=fault, breaks_after=after))
    texts: dict[str, str] = {}
    answers = []
    async with faulty_beside_healthy(store_url, faulty) as (url, good):
        for i in range(REQUESTS):
            dialect = DIALECTS[i % len(DIALECTS)]
            session, text = f"s-{uuid.uuid4().hex[:8]}", f"turn {i}"
            texts[session] = text
            if stream:
                status, events = await streamed(
                    client, f"{url}{dialect.path}", body(dialect, text, True), session
                )
                answers.append((status, stream_error(dialect, events)))
            else:
                resp = await client.post(
                    f"{url}{dialect.path}",
                    json=body(dialect, text, False),
                    headers={"x-session-id": session},
                )
                answers.append((resp.status_code, resp.json().get("error")))
        state, opened = await breaker(client, url, faulty.url)
    assert answers == [(200, None)] * REQUESTS, answers
    assert len(faulty.requests) == FAILURES  # then its breaker kept requests away
    assert len(good.requests) == REQUESTS
    assert (state, opened) == (2, 1)
    await assert_stored_once(store_url, texts)


async def test_a_reply_taken_over_by_another_replica_is_stored_once_assigned_to_it(
    store_url: str, client: httpx.AsyncClient
) -> None:
    """The history is written when the faulty replica's first chunk arrives, and again when
    the healthy one takes the broken reply over: the turn is appended once, and a sticky
    session is assigned to the replica that answered it."""
    faulty = FakeUpstream(default=ScriptedReply("a longer reply", breaks="drop", breaks_after=2))
    texts: dict[str, str] = {}
    async with faulty_beside_healthy(store_url, faulty, policy="sticky") as (url, good):
        for i in range(2 * FAILURES):
            session, text = f"s-{uuid.uuid4().hex[:8]}", f"turn {i}"
            texts[session] = text
            resp = await client.post(
                f"{url}/v1/chat/completions",
                json=body(DIALECTS[0], text, False),
                headers={"x-session-id": session},
            )
            assert resp.status_code == 200, resp.text
    assert faulty.requests  # some sessions were placed on it first
    await assert_stored_once(store_url, texts)
    async with store_at(store_url) as store:
        for session in texts:
            assert await store.get_assignment(DEFAULT_TENANT, session) == good.url


# --- a stream that breaks once it has begun: the dialect's error event --------------------


@pytest.mark.parametrize("fault", ["not_json", "cut_line", "drop", "error"])
@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.path.rsplit("/", 1)[1])
async def test_a_stream_that_breaks_after_its_first_chunk_ends_in_the_dialects_error_event(
    store_url: str, client: httpx.AsyncClient, fault: str, dialect: Dialect
) -> None:
    faulty = FakeUpstream(default=ScriptedReply("a longer reply", breaks=fault, breaks_after=2))
    texts: dict[str, str] = {}
    answers = []
    async with faulty_beside_healthy(store_url, faulty) as (url, good):
        for i in range(REQUESTS):
            session, text = f"s-{uuid.uuid4().hex[:8]}", f"turn {i}"
            texts[session] = text
            answers.append(
                await streamed(client, f"{url}{dialect.path}", body(dialect, text, True), session)
            )
        state, opened = await breaker(client, url, faulty.url)
    errors = [stream_error(dialect, events) for _, events in answers]
    broken = [error for error in errors if error is not None]
    assert [status for status, _ in answers] == [200] * REQUESTS  # the stream had begun
    assert len(broken) == FAILURES == len(faulty.requests)
    for error in broken:  # the replica's failure, not the gateway's
        assert error["message"].startswith("upstream failed mid-stream: ")
        assert "internal error" not in error["message"]
    assert len(good.requests) == REQUESTS - FAILURES
    assert (state, opened) == (2, 1)
    await assert_stored_once(store_url, texts)  # a broken stream's turn too: it was accepted


# --- no healthy replica: the dialect's error shape, never a 500 ---------------------------


@pytest.mark.parametrize("fault", ["not_json", "cut_line", "drop", "error"])
@pytest.mark.parametrize("after", [0, 1])
async def test_with_no_healthy_replica_a_fault_is_a_502_in_the_dialects_shape(
    store_url: str, client: httpx.AsyncClient, fault: str, after: int
) -> None:
    faulty = FakeUpstream(default=ScriptedReply("a longer reply", breaks=fault, breaks_after=after))
    answers = []
    texts: dict[str, str] = {}
    async with faulty_beside_healthy(store_url, faulty, healthy=False) as (url, _):
        for i in range(FAILURES + 1):
            dialect = DIALECTS[i % len(DIALECTS)]
            session, text = f"s-{uuid.uuid4().hex[:8]}", f"turn {i}"
            texts[session] = text
            resp = await client.post(
                f"{url}{dialect.path}",
                json=body(dialect, text, False),
                headers={"x-session-id": session},
            )
            answers.append((dialect, resp))
        state, opened = await breaker(client, url, faulty.url)
    statuses = [resp.status_code for _, resp in answers]
    assert statuses == [502] * FAILURES + [503], [resp.text for _, resp in answers]
    for dialect, resp in answers:
        assert error_of(dialect, resp.json())["message"]
        assert faulty.url not in resp.text  # no internal address
    assert (state, opened) == (2, 1)
    if after == 0:  # no replica accepted a request: nothing stored
        async with store_at(store_url) as store:
            assert not (await store.list_sessions(DEFAULT_TENANT))
    else:  # accepted at the first chunk, then broken: stored once, as the client resends it
        await assert_stored_once(store_url, dict(list(texts.items())[:FAILURES]))


# --- /v1/models answering 404 --------------------------------------------------------------


async def test_a_replica_without_a_model_listing_is_no_model_learned(
    store_url: str, client: httpx.AsyncClient
) -> None:
    """No ``upstream_model`` configured: the model is learned from the replica that lists
    one; one that answers 404 is skipped, and serves chats like any other."""
    faulty = FakeUpstream(models_status=404)
    texts: dict[str, str] = {}
    answers = []
    async with faulty_beside_healthy(store_url, faulty) as (url, good):
        models = await client.get(f"{url}/v1/models")
        for i in range(4):
            dialect = DIALECTS[i % 2]  # chat and messages
            session, text = f"s-{uuid.uuid4().hex[:8]}", f"turn {i}"
            texts[session] = text
            resp = await client.post(
                f"{url}{dialect.path}",
                json=body(dialect, text, False),
                headers={"x-session-id": session},
            )
            answers.append(resp)
    assert models.status_code == 200, models.text
    assert [m["id"] for m in models.json()["data"]] == [FAKE_MODEL]
    assert [r.status_code for r in answers] == [200] * 4, [r.text for r in answers]
    assert faulty.requests and good.requests  # both served
    assert {r["model"] for r in faulty.requests + good.requests} == {FAKE_MODEL}
    await assert_stored_once(store_url, texts)


async def test_with_no_replica_listing_a_model_the_clients_model_goes_upstream(
    store_url: str, client: httpx.AsyncClient
) -> None:
    faulty = FakeUpstream(models_status=404)
    async with faulty_beside_healthy(store_url, faulty, healthy=False) as (url, _):
        models = await client.get(f"{url}/v1/models")
        chat = await client.post(f"{url}/v1/chat/completions", json=body(DIALECTS[0], "a", False))
        messages = await client.post(f"{url}/v1/messages", json=body(DIALECTS[1], "b", False))
    assert models.status_code == 200 and models.json()["data"] == []
    assert chat.status_code == 200, chat.text
    assert messages.status_code == 200, messages.text
    assert [r["model"] for r in faulty.requests] == ["m", "m"]  # the client's model


# --- what the upstream client reads as a chunk ---------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"{not json",
        b"3",
        b"[]",
        b'"text"',
        b'{"choices": {"0": {}}}',
        b'{"choices": [1]}',
        b'{"choices": [{"delta": [1]}]}',
        b'{"choices": [{"delta": {"tool_calls": {"a": 1}}}]}',
        b'{"choices": [{"delta": {"tool_calls": [{"index": "0"}]}}]}',
        b'{"choices": [{"delta": {"tool_calls": [{"function": {"name": 1}}]}}]}',
        b'{"choices": [], "usage": 7}',
    ],
)
def test_a_data_line_that_is_not_a_chunk_object_is_refused(data: bytes) -> None:
    assert parse_chunk(data) is None


def test_a_chunk_is_read_as_sent() -> None:
    chunk = FakeUpstream.chunks(ScriptedReply("hi", tool_calls=[("f", '{"a": 1}')]), 3)
    assert [parse_chunk(json.dumps(c).encode()) for c in chunk] == chunk


class RawUpstream(FakeUpstream):
    """Streams ``frames`` as they are, whatever the request."""

    def __init__(self, frames: bytes) -> None:
        super().__init__()
        self.frames = frames

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        await request.json()
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(self.frames)
        await resp.write_eof()
        return resp


async def opened(frames: bytes) -> UpstreamError:
    """What the upstream client raises opening a stream of ``frames``."""
    fake = await RawUpstream(frames).start()
    client = UpstreamClient()
    try:
        with pytest.raises(UpstreamError) as err:
            await client.open_chat_stream(fake.url, {"model": "m", "messages": []})
    finally:
        await client.close()
        await fake.stop()
    return err.value


@pytest.mark.parametrize(("code", "status", "retryable"), [(400, 400, False), (None, 502, True)])
async def test_an_error_event_is_a_refusal_with_a_4xx_code_else_the_replicas_failure(
    code: int | None, status: int, retryable: bool
) -> None:
    error = {"message": "no", "type": "BadRequestError", "code": code}
    failed = await opened(f"data: {json.dumps({'error': error})}\n\n".encode())
    assert (failed.status, failed.retryable) == (status, retryable)
    assert failed.body["error"]["message"] == "no"


async def test_a_line_past_the_read_buffer_is_the_replicas_failure() -> None:
    failed = await opened(b"data: " + b" " * (4 << 20) + b"{}\n\n")
    assert (failed.status, failed.retryable) == (502, True)
