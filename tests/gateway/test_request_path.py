"""The request path's promises over the FAKE upstream with injected faults, on both stores:
a request refused before an upstream accepted it writes nothing, and a client that goes
away cancels the upstream request, streaming or not, before the first byte or during it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.requests import ClientDisconnect

from gateway.app import create_app
from gateway.config import GatewayConfig
from loadtests.fake_upstream import FakeUpstream, ScriptedReply
from tests.gateway.conftest import running_gateway, store_at

DEAD_REPLICA = "http://127.0.0.1:9"


@pytest.fixture(params=["sqlite", "redis"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/store.db"
    return request.getfixturevalue("redis_url")


@asynccontextmanager
async def gateway(
    store_url: str, fake: FakeUpstream | None, **overrides: Any
) -> AsyncIterator[tuple[str, str]]:
    """A gateway over ``fake`` (or a replica nothing listens on); yields (url, tenant)."""
    tenant = f"t-{uuid.uuid4().hex[:8]}"  # its own key space in a shared Redis
    replicas = (fake.url,) if fake is not None else (DEAD_REPLICA,)
    config = GatewayConfig(
        store_url=store_url,
        replicas=replicas,
        probe_interval_s=0.5,
        default_tenant=tenant,
        **overrides,
    )
    async with running_gateway(config) as url:
        yield url, tenant


def chat(n: int, *, stream: bool = False, **extra: Any) -> dict[str, Any]:
    messages = [{"role": "system", "content": "agent"}]
    for i in range(n):
        messages.append({"role": "user", "content": f"question {i} " * 20})
        messages.append({"role": "assistant", "content": f"answer {i}"})
    messages.append({"role": "user", "content": f"question {n}"})
    return {"model": "m", "messages": messages, "max_tokens": 8, "stream": stream, **extra}


async def snapshot(store_url: str, tenant: str, session: str) -> dict[str, Any]:
    """Everything the store holds for the session that a request could have written."""
    async with store_at(store_url) as store:
        sessions = await store.list_sessions(tenant)
        out: dict[str, Any] = {
            "sessions": sessions,
            "assignment": await store.get_assignment(tenant, session),
            "tenant_counts": await store.get_tenant_counts(tenant),
        }
        if session in sessions:
            history = await store.load(tenant, session)
            out["messages"] = history.messages
            out["branch"] = history.branch_id
            out["counts"] = await store.get_counts(tenant, session, history.branch_id)
            out["log"] = await store.get_log(tenant, session, history.branch_id)
        return out


async def healthy(http: httpx.AsyncClient) -> None:
    """Until the pool takes the replica back after a failure (its probes answer)."""
    for _ in range(100):
        if (await http.get("/health")).status_code == 200:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the replica did not come back")


async def settled(fake: FakeUpstream) -> None:
    await asyncio.sleep(0.2)  # accounting runs after the reply


async def test_refused_requests_leave_the_store_as_it_was(backend: str) -> None:
    fake = await FakeUpstream().start()
    headers = {"x-session-id": "s"}
    try:
        async with (
            gateway(backend, fake, tenants={"*": {"session_bytes": 3_000}}) as (url, tenant),
            httpx.AsyncClient(base_url=url, timeout=30) as http,
        ):
            # A new session refused by the upstream: nothing at all.
            fake.script.append(ScriptedReply(status=500))
            resp = await http.post("/v1/chat/completions", json=chat(1), headers=headers)
            assert resp.status_code == 502, resp.text
            assert await snapshot(backend, tenant, "s") == {
                "sessions": [],
                "assignment": None,
                "tenant_counts": {},
            }
            # An accepted request, then refusals of its continuation: the first stays as is.
            await healthy(http)
            resp = await http.post("/v1/chat/completions", json=chat(1), headers=headers)
            assert resp.status_code == 200, resp.text
            await settled(fake)
            before = await snapshot(backend, tenant, "s")
            assert len(before["messages"]) == 4 and before["counts"]["requests"] == 1
            assert len(before["log"]) == 1 and before["assignment"] == fake.url
            fake.script.append(ScriptedReply(status=503))
            resp = await http.post("/v1/chat/completions", json=chat(2), headers=headers)
            assert resp.status_code == 502, resp.text
            await healthy(http)
            # Past the tenant's session size: refused on the store's read, so no upstream
            # is asked.
            asked = len(fake.requests)
            resp = await http.post("/v1/chat/completions", json=chat(12), headers=headers)
            assert resp.status_code == 413, resp.text
            assert len(fake.requests) == asked
            await settled(fake)
            assert await snapshot(backend, tenant, "s") == before
            # Two continuations that fit alone but not together, both read before either is
            # stored: the write's atomic check refuses the second once its upstream answered,
            # and that reply is closed unread.
            slow = ScriptedReply(content="x" * 80, first_chunk_delay_s=1.0, chunk_delay_s=0.05)
            fake.script.extend([slow, slow])
            forks = [chat(1) for _ in range(2)]
            for body in forks:  # ~1.5 KB each, stored compressed
                body["messages"] += [
                    {"role": "assistant", "content": "answer 1"},
                    {"role": "user", "content": os.urandom(1400).hex()},
                ]
            both = await asyncio.gather(
                *(http.post("/v1/chat/completions", json=b, headers=headers) for b in forks)
            )
            assert sorted(r.status_code for r in both) == [200, 413], [r.text for r in both]
            for _ in range(100):
                if fake.aborted:
                    break
                await asyncio.sleep(0.05)
            assert len(fake.aborted) == 1
    finally:
        await fake.stop()


async def test_a_context_overflow_given_up_writes_nothing(backend: str) -> None:
    # Every rung of the overflow ladder is still over this window.
    fake = await FakeUpstream(max_model_len=20).start()
    try:
        async with (
            gateway(backend, fake) as (url, tenant),
            httpx.AsyncClient(base_url=url, timeout=30) as http,
        ):
            resp = await http.post(
                "/v1/chat/completions", json=chat(3), headers={"x-session-id": "s"}
            )
            assert resp.status_code == 400, resp.text
            assert fake.refused and not fake.requests
            assert (await snapshot(backend, tenant, "s"))["sessions"] == []
    finally:
        await fake.stop()


async def test_no_replica_writes_nothing(backend: str) -> None:
    async with (
        gateway(backend, None) as (url, tenant),
        httpx.AsyncClient(base_url=url, timeout=30) as http,
    ):
        resp = await http.post("/v1/chat/completions", json=chat(1), headers={"x-session-id": "s"})
        assert resp.status_code in (502, 503), resp.text
        assert await snapshot(backend, tenant, "s") == {
            "sessions": [],
            "assignment": None,
            "tenant_counts": {},
        }


async def _aborted(fake: FakeUpstream, timeout_s: float = 5.0) -> bool:
    for _ in range(int(timeout_s / 0.05)):
        if fake.aborted:
            return True
        await asyncio.sleep(0.05)
    return False


@pytest.mark.parametrize("stream", [False, True])
async def test_a_client_gone_before_the_first_byte_cancels_the_upstream(
    stream: bool, tmp_path: Path
) -> None:
    backend = f"sqlite:///{tmp_path}/store.db"
    fake = await FakeUpstream([ScriptedReply(first_chunk_delay_s=10)]).start()
    try:
        async with gateway(backend, fake) as (url, tenant):
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                request = asyncio.create_task(
                    http.post(
                        "/v1/chat/completions",
                        json=chat(1, stream=stream),
                        headers={"x-session-id": "s"},
                    )
                )
                # The client leaves once the upstream has the request (not after a fixed
                # time, which a slow machine may spend before the request gets there).
                while not fake.requests and not request.done():
                    await asyncio.sleep(0.02)
                request.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await request
            assert await _aborted(fake), "the upstream request was not cancelled"
            # The upstream never accepted it: nothing stored.
            assert (await snapshot(backend, tenant, "s"))["sessions"] == []
    finally:
        await fake.stop()


async def test_a_client_gone_during_a_non_streaming_reply_cancels_the_upstream(
    tmp_path: Path,
) -> None:
    backend = f"sqlite:///{tmp_path}/store.db"
    fake = await FakeUpstream([ScriptedReply(content="y" * 800, chunk_delay_s=0.05)]).start()
    try:
        async with gateway(backend, fake) as (url, _):
            async with httpx.AsyncClient(base_url=url, timeout=0.5) as http:
                with pytest.raises(httpx.ReadTimeout):
                    await http.post("/v1/chat/completions", json=chat(1))
            assert await _aborted(fake), "the upstream request was not cancelled"
    finally:
        await fake.stop()


async def test_a_client_gone_during_a_stream_cancels_the_upstream(tmp_path: Path) -> None:
    backend = f"sqlite:///{tmp_path}/store.db"
    fake = await FakeUpstream([ScriptedReply(content="y" * 800, chunk_delay_s=0.05)]).start()
    try:
        async with (
            gateway(backend, fake) as (url, _),
            httpx.AsyncClient(base_url=url, timeout=10) as http,
        ):
            async with http.stream(
                "POST", "/v1/chat/completions", json=chat(1, stream=True)
            ) as resp:
                assert resp.status_code == 200
                async for _ in resp.aiter_bytes():
                    break  # the first frame, then the client leaves
            assert await _aborted(fake), "the upstream request was not cancelled"
    finally:
        await fake.stop()


@pytest.mark.parametrize("spec", ["2.3", "2.4"])
async def test_a_client_gone_before_the_first_frame_settles_the_reply(
    spec: str, tmp_path: Path
) -> None:
    """The client leaves while the response's head is being sent, so the reply's stream
    never starts (an async generator never started runs none of its cleanup): the
    upstream is closed all the same, and the request's working-set share ends, so it
    holds no room on its replica. On an ASGI 2.3 server the disconnect cancels the send;
    on a 2.4 one the send raises."""
    fake = await FakeUpstream([ScriptedReply(content="y" * 800, chunk_delay_s=0.05)]).start()
    config = GatewayConfig(
        store_url=f"sqlite:///{tmp_path}/store.db", replicas=(fake.url,), probe_interval_s=0.5,
        admission=True, kv_pool_tokens=100_000,
    )  # fmt: skip
    app = create_app(config)
    body = json.dumps(chat(1, stream=True)).encode()
    scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": spec},
        "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
        "query_string": b"", "root_path": "", "client": ("127.0.0.1", 5001),
        "server": ("127.0.0.1", 80),
        "headers": [
            (b"host", b"gw"), (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()), (b"x-session-id", b"s"),
        ],
    }  # fmt: skip
    gone = asyncio.Event()
    sent: list[str] = []
    pulls = iter([{"type": "http.request", "body": body, "more_body": False}])

    async def receive() -> dict[str, Any]:
        message = next(pulls, None)
        if message is not None:
            return message
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message["type"])
        if message["type"] == "http.response.start":
            gone.set()  # the client leaves as the head goes out
            if spec == "2.4":
                raise OSError("the client is gone")
            await asyncio.Event().wait()  # its socket takes nothing: the watcher cancels

    try:
        async with app.router.lifespan_context(app):
            with contextlib.suppress(ClientDisconnect):
                await app(scope, receive, send)
            assert sent == ["http.response.start"], "no frame reached the client"
            assert await _aborted(fake), "the upstream request was not closed"
            admission = app.state.pipeline.kv.gate.admission
            shares = [m for members in admission.members.values() for m in members.values()]
            assert fake.requests and not any(m.running for m in shares), shares
    finally:
        await fake.stop()
