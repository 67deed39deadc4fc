"""Limits of the served gateway: slow clients, slow upstreams, metric labels, secrets."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import time
import weakref

import pytest
from aiohttp import web
from click.testing import CliRunner

from gateway.app import create_app
from gateway.cli import main
from gateway.config import GatewayConfig
from gateway.exposure import ReplicaLabels
from gateway.serve import redact_url
from gateway.tenants import hash_key
from gateway.upstream import UpstreamClient, UpstreamError
from loadtests.fake_upstream import FakeUpstream, ScriptedReply


async def open_raw(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


async def test_half_sent_headers_are_dropped(gateway_with_fake):
    async with gateway_with_fake(header_timeout_s=0.5) as (url, _fake):
        reader, writer = await open_raw(url)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")  # and no more
        await writer.drain()
        started = time.monotonic()
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
        assert time.monotonic() - started < 2
        writer.close()


async def test_a_body_that_never_arrives_is_a_408(gateway_with_fake):
    async with gateway_with_fake(body_timeout_s=0.5) as (url, fake):
        reader, writer = await open_raw(url)
        writer.write(
            b"POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: 1000\r\n\r\n{"
        )
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        writer.close()
        assert head.startswith(b"HTTP/1.1 408")
        assert fake.requests == []


async def test_a_client_that_leaves_before_its_body_ends_is_a_499(store_url, caplog):
    """A body cut off by the client's disconnect (a chunked body cut midway, a
    Content-Length never reached): nothing to answer, nothing stored, no error logged."""
    fake = await FakeUpstream().start()
    app = create_app(GatewayConfig(store_url=store_url, replicas=(fake.url,)))
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]}).encode()
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "headers": [(b"content-type", b"application/json"), (b"x-session-id", b"cut")],
    }
    pulls = iter([{"type": "http.request", "body": body[:10], "more_body": True}])
    sent: list[dict] = []

    async def receive() -> dict:
        return next(pulls, {"type": "http.disconnect"})

    async def send(message: dict) -> None:
        sent.append(message)

    try:
        async with app.router.lifespan_context(app):
            await app(scope, receive, send)
            assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 499
            assert await app.state.pipeline.store.list_sessions("default") == []
    finally:
        await fake.stop()
    assert fake.requests == []
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_strategy_label_takes_bounded_values(gateway_with_fake, client):
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    async with gateway_with_fake() as (url, _fake):
        for value in (f"junk-{i}" for i in range(20)):
            resp = await client.post(
                f"{url}/v1/chat/completions", json=body, headers={"x-foldgate-strategy": value}
            )
            assert resp.status_code == 400
        metrics = (await client.get(f"{url}/metrics")).text
    assert "junk" not in metrics
    assert 'strategy="other"' in metrics


def test_store_passwords_never_reach_the_banner():
    assert redact_url("redis://:s3cret@redis:6379/0") == "redis://:***@redis:6379/0"
    assert redact_url("rediss://user:pw@h:1/2") == "rediss://user:***@h:1/2"
    assert redact_url("redis://h:6379/0") == "redis://h:6379/0"


def test_keys_create_prints_a_key_and_its_hash_lines():
    out = CliRunner().invoke(main, ["keys", "create", "--tenant", "acme"])
    assert out.exit_code == 0, out.output
    key = out.output.split("it is not stored): ")[1].split()[0]
    assert f'"{hash_key(key)}" = "acme"' in out.output
    assert f"{hash_key(key)}=acme" in out.output
    again = CliRunner().invoke(main, ["keys", "hash", "--tenant", "acme"], input=f"{key}\n")
    assert again.exit_code == 0 and hash_key(key) in again.output


class StallingUpstream(FakeUpstream):
    """Waits ``before`` seconds, then streams one chunk every ``gap`` seconds, ``chunks``
    of them."""

    def __init__(self, before: float, gap: float, chunks: int) -> None:
        super().__init__(default=ScriptedReply("x" * chunks, chunk_chars=1))
        self.before, self.gap = before, gap

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        await request.json()
        await asyncio.sleep(self.before)
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for chunk in self.chunks(self.default, prompt_tokens=1):
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await asyncio.sleep(self.gap)
        await resp.write(b"data: [DONE]\n\n")
        return resp


async def read_all(client: UpstreamClient, url: str) -> list[dict]:
    stream = await client.open_chat_stream(url, {"model": "m", "messages": []})
    return [chunk async for chunk in stream]


# Timeouts wide enough that a loaded 2-core CI machine answering an immediate chunk never
# trips them (0.4 s once did); each stalling case overruns its timeout by 1 s.
TIMEOUT_S = 1.5


@pytest.mark.parametrize(
    ("before", "gap", "outcome"),
    [
        (0.0, 0.17, "ok"),  # 1.7 s in all, past the idle timeout: no total cap
        (0.0, TIMEOUT_S + 1, "idle"),
        (TIMEOUT_S + 1, 0.0, "first"),
    ],
)
async def test_upstream_first_chunk_and_idle_timeouts(before, gap, outcome):
    fake = await StallingUpstream(before, gap, chunks=10).start()
    client = UpstreamClient(
        connect_timeout_s=1, first_chunk_timeout_s=TIMEOUT_S, idle_timeout_s=TIMEOUT_S
    )
    try:
        if outcome == "ok":
            chunks = await read_all(client, fake.url)
            assert (
                "".join(
                    c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]
                )
                == "x" * 10
            )
        else:
            with pytest.raises(UpstreamError) as err:
                await read_all(client, fake.url)
            if outcome == "first":
                assert f"no first chunk within {TIMEOUT_S} s" in str(err.value)
                assert err.value.retryable
            else:
                assert "stream broke" in str(err.value) and not err.value.retryable
    finally:
        await client.close()
        await fake.stop()


async def test_a_reader_slower_than_the_idle_timeout_is_not_an_idle_upstream():
    """The idle timeout bounds the wait for the replica's next line, not the time the
    reader (a slow client) takes between lines it already has."""
    fake = await StallingUpstream(0.0, 0.0, chunks=3).start()
    client = UpstreamClient(
        connect_timeout_s=1, first_chunk_timeout_s=TIMEOUT_S, idle_timeout_s=TIMEOUT_S / 3
    )
    try:
        stream = await client.open_chat_stream(fake.url, {"model": "m", "messages": []})
        chunks = []
        async for chunk in stream:
            chunks.append(chunk)
            await asyncio.sleep(TIMEOUT_S / 2)  # longer than the idle timeout
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        assert "".join(d.get("content") or "" for d in deltas) == "xxx"
    finally:
        await client.close()
        await fake.stop()


async def test_a_stream_no_one_reads_any_more_is_not_kept_alive_by_its_idle_timer():
    """A client gone before the reply's first frame leaves its opened stream unread: the
    idle timeout's timer must not hold it (and its connection) past the timeout."""
    fake = await StallingUpstream(0.0, 0.0, chunks=3).start()
    client = UpstreamClient(
        connect_timeout_s=1, first_chunk_timeout_s=TIMEOUT_S, idle_timeout_s=TIMEOUT_S / 3
    )
    try:
        stream = await client.open_chat_stream(fake.url, {"model": "m", "messages": []})
        left = weakref.ref(stream)
        del stream
        await asyncio.sleep(TIMEOUT_S)  # past the idle timeout, twice over
        gc.collect()
        assert left() is None
    finally:
        await client.close()
        await fake.stop()


async def test_metrics_show_replicas_by_their_labels_not_their_urls(gateway_with_fake, client):
    """``/metrics`` answers without a key (a scraper needs none): its replica series carry
    the label clients are shown elsewhere, stable for a secret, never the internal URL."""
    keys = {hash_key("key-acme"): "acme"}
    secret = "labels-secret"
    async with gateway_with_fake(api_keys=keys, cache_salt_secret=secret) as (url, fake):
        resp = await client.get(f"{url}/metrics")
        health = (await client.get(f"{url}/health")).json()
    assert resp.status_code == 200
    assert fake.url not in resp.text
    host = fake.url.removeprefix("http://")
    assert host not in resp.text and host.split(":")[0] not in resp.text
    label = ReplicaLabels(secret).label(fake.url)
    assert health["healthy_replicas"] == [label]
    assert f'foldgate_router_replica_healthy{{replica="{label}"}} 1.0' in resp.text
    assert f'foldgate_router_breaker_state{{replica="{label}"}} 0.0' in resp.text


async def test_debug_metrics_name_the_replicas(gateway_with_fake, client):
    async with gateway_with_fake(debug=True) as (url, fake):
        metrics = (await client.get(f"{url}/metrics")).text
    assert f'foldgate_router_replica_healthy{{replica="{fake.url}"}} 1.0' in metrics
