"""Per-tenant quotas through the gateway (FAKE upstream, real store; real Redis shared by
two gateway processes)."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from dataclasses import replace

import httpx
from aiohttp import web

from gateway.config import GatewayConfig
from gateway.tenants import hash_key
from loadtests.fake_upstream import FakeUpstream
from store import NotFound
from tests.gateway.conftest import gateway_process, running_gateway, store_at


def chat(text: str, **extra) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": text}], **extra}


def keyed(tenant: str) -> tuple[dict[str, str], dict[str, str]]:
    """A key table with one key for ``tenant``, and the headers that present it."""
    return {hash_key(f"key-{tenant}"): tenant}, {"x-api-key": f"key-{tenant}"}


async def away_from_the_minute_turn() -> None:
    """Per-minute windows restart on the minute: a test that counts in one window starts
    early enough in it."""
    into = time.time() % 60
    if into > 45:
        await asyncio.sleep(60 - into + 0.1)


async def test_limits_hold_across_two_gateway_processes_sharing_redis(redis_url, tmp_path):
    rated, rated_headers = keyed(f"rated-{uuid.uuid4().hex[:8]}")
    counted, counted_headers = keyed(f"sessions-{uuid.uuid4().hex[:8]}")
    fake = await FakeUpstream().start()
    config = GatewayConfig(
        store_url=redis_url,
        replicas=(fake.url,),
        probe_interval_s=0.5,
        api_keys={**rated, **counted},
        tenants={
            next(iter(rated.values())): {"requests_per_minute": 6},
            next(iter(counted.values())): {"sessions": 2},
        },
    )

    async def post(url: str, headers: dict, session: str, path: str = "/v1/chat/completions"):
        body = {**chat(f"in {session}"), "max_tokens": 8}
        return await client.post(
            f"{url}{path}", json=body, headers={**headers, "x-session-id": session}
        )

    try:
        await away_from_the_minute_turn()
        async with (
            running_gateway(config) as first,
            gateway_process(config, tmp_path) as (second, _),
            httpx.AsyncClient(timeout=30) as client,
        ):
            rates = [
                (await post((first, second)[i % 2], rated_headers, f"s{i % 3}")).status_code
                for i in range(10)
            ]
            refused = await post(second, rated_headers, "s0", "/v1/messages")
            sessions = [
                (await post(url, counted_headers, session)).status_code
                for url, session in ((first, "a"), (second, "b"), (first, "c"), (second, "a"))
            ]
    finally:
        await fake.stop()
    print(f"\nrequests_per_minute=6 over two gateway processes: {rates}")
    print(f"sessions=2 over two gateway processes (a, b, c, a): {sessions}")
    assert rates == [200] * 6 + [429] * 4
    assert refused.status_code == 429 and 1 <= int(refused.headers["retry-after"]) <= 60
    assert refused.json()["type"] == "error"  # Anthropic's shape, from the second process
    assert "limit of 6 requests per minute" in refused.json()["error"]["message"]
    assert sessions == [200, 200, 429, 200]
    async with store_at(redis_url) as store:
        assert sorted(await store.list_sessions(next(iter(counted.values())))) == ["a", "b"]


async def test_429_in_each_dialect_shape_with_retry_after(gateway_with_fake, client):
    keys, headers = keyed("acme")
    tenants = {"acme": {"requests_per_minute": 1}}
    await away_from_the_minute_turn()
    async with gateway_with_fake(api_keys=keys, tenants=tenants) as (url, fake):
        first = await client.post(f"{url}/v1/chat/completions", json=chat("a"), headers=headers)
        openai = await client.post(
            f"{url}/v1/chat/completions", json=chat("a", stream=True), headers=headers
        )
        anthropic = await client.post(
            f"{url}/v1/messages", json={**chat("a"), "max_tokens": 8}, headers=headers
        )
        responses = await client.post(
            f"{url}/v1/responses",
            json={"model": "m", "input": "a", "stream": True},
            headers=headers,
        )
        assert len(fake.requests) == 1
    assert first.status_code == 200
    for resp in (openai, anthropic, responses):
        assert resp.status_code == 429
        assert 1 <= int(resp.headers["retry-after"]) <= 60
    for resp in (openai, responses):
        error = resp.json()["error"]
        assert error["type"] == "rate_limit_error" and "requests per minute" in error["message"]
        assert error["code"] == "rate_limit_exceeded"
        assert set(error) == {"message", "type", "param", "code"}
    body = anthropic.json()
    assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error"


async def test_prompt_token_limit_refuses_before_anything_is_stored(
    gateway_with_fake, client, store_url
):
    keys, headers = keyed("acme")
    tenants = {"acme": {"raw_tokens_per_minute": 400}}
    await away_from_the_minute_turn()
    async with gateway_with_fake(api_keys=keys, tenants=tenants) as (url, fake):
        small = await client.post(
            f"{url}/v1/chat/completions",
            json=chat("short"),
            headers={**headers, "x-session-id": "s"},
        )
        big = await client.post(
            f"{url}/v1/chat/completions",
            json=chat("word " * 2000),
            headers={**headers, "x-session-id": "big"},
        )
        assert len(fake.requests) == 1
    assert small.status_code == 200
    assert big.status_code == 429 and "prompt tokens per minute" in big.text
    async with store_at(store_url) as store:
        assert await store.list_sessions("acme") == ["s"]
        try:
            await store.load("acme", "big")
            raise AssertionError("a refused request stored its history")
        except NotFound:
            pass


async def test_upstream_token_limit_counts_what_the_replica_reported(gateway_with_fake, client):
    keys, headers = keyed("acme")
    tenants = {"acme": {"upstream_tokens_per_minute": 30}}
    await away_from_the_minute_turn()
    async with gateway_with_fake(api_keys=keys, tenants=tenants) as (url, _fake):
        statuses = []
        for i in range(4):
            resp = await client.post(
                f"{url}/v1/chat/completions", json=chat(f"question {i} " * 10), headers=headers
            )
            statuses.append(resp.status_code)
            await asyncio.sleep(0.2)  # the reply's tokens are added after it
    # the fake reports len(json(messages)) // 4 = ~36 prompt tokens per request
    assert statuses == [200, 429, 429, 429]


async def test_session_size_limit_is_a_413_before_the_upstream_and_stores_nothing(
    gateway_with_fake, client, store_url
):
    """A request that would take its session past the cap is refused on the store's read,
    before the upstream: it reaches no replica, stores nothing and charges no quota."""
    keys, headers = keyed("acme")
    # Random hex is stored compressed to about half: 1.5 KB for 1,500 random bytes.
    big = os.urandom(1500).hex()
    tenants = {"*": {"session_bytes": 1200, "raw_tokens_per_minute": 1000}}
    await away_from_the_minute_turn()
    async with gateway_with_fake(api_keys=keys, tenants=tenants) as (url, fake):
        first = await client.post(
            f"{url}/v1/chat/completions",
            json=chat("hello"),
            headers={**headers, "x-session-id": "s"},
        )
        history = [
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": big},
        ]
        grown = await client.post(
            f"{url}/v1/messages",
            json={"model": "m", "max_tokens": 8, "messages": history},
            headers={**headers, "x-session-id": "s"},
        )
        new = await client.post(
            f"{url}/v1/chat/completions", json=chat(big), headers={**headers, "x-session-id": "n"}
        )
        upstream_asked = len(fake.requests)
        # ~400 prompt tokens: within the minute's 1,000 only if the refused ~750 were not charged
        after = await client.post(
            f"{url}/v1/chat/completions",
            json=chat("word " * 320),
            headers={**headers, "x-session-id": "t"},
        )
    assert first.status_code == 200
    assert upstream_asked == 1
    assert grown.status_code == 413 and "retry-after" not in grown.headers
    assert grown.json()["type"] == "error"
    assert grown.json()["error"]["type"] == "request_too_large"
    assert "1200-byte cap" in grown.json()["error"]["message"]
    assert new.status_code == 413 and "1200-byte cap" in new.json()["error"]["message"]
    assert after.status_code == 200, after.text
    async with store_at(store_url) as store:
        assert sorted(await store.list_sessions("acme")) == ["s", "t"]
        stored = await store.load("acme", "s")
        assert len(stored.messages) == 1


class SlowUpstream(FakeUpstream):
    """The fake upstream, answering each request after a pause."""

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(0.4)
        return await super()._chat(request)


async def test_concurrent_requests_limit_and_slots_come_back(store_url):
    keys, headers = keyed("acme")
    fake = await SlowUpstream().start()
    config = replace(
        GatewayConfig(store_url=store_url, replicas=(fake.url,), probe_interval_s=0.5),
        api_keys=keys,
        tenants={"acme": {"concurrent_requests": 2}},
    )
    try:
        async with running_gateway(config) as url, httpx.AsyncClient(timeout=30) as client:
            bodies = [chat("a"), chat("b", stream=True), chat("c"), chat("d", stream=True)]
            replies = await asyncio.gather(
                *(
                    client.post(f"{url}/v1/chat/completions", json=b, headers=headers)
                    for b in bodies
                )
            )
            codes = sorted(r.status_code for r in replies)
            # every slot is back once the replies (streamed or not) are done
            after = await asyncio.gather(
                *(
                    client.post(f"{url}/v1/chat/completions", json=b, headers=headers)
                    for b in bodies[:2]
                )
            )
    finally:
        await fake.stop()
    assert codes == [200, 200, 429, 429]
    assert [r.status_code for r in after] == [200, 200]
    refused = next(r for r in replies if r.status_code == 429)
    # when the earliest slot's lease would run out: within one lease period
    assert 1 <= int(refused.headers["retry-after"]) <= config.lease_period_s
    assert "concurrent requests" in refused.json()["error"]["message"]


async def test_tenant_default_strategy(gateway_with_fake, client):
    keys, headers = keyed("acme")
    tenants = {"*": {"strategy": "base"}}
    async with gateway_with_fake(api_keys=keys, tenants=tenants) as (url, fake):
        for extra in ({}, {"x-foldgate-strategy": "refold"}):
            resp = await client.post(
                f"{url}/v1/chat/completions",
                json=chat("hello"),
                headers={**headers, **extra, "x-session-id": f"s{len(extra)}"},
            )
            assert resp.status_code == 200
        metrics = (await client.get(f"{url}/metrics")).text
    assert 'foldgate_requests_total{dialect="openai",status="ok",strategy="base"}' in metrics
    assert len(fake.requests) == 2
