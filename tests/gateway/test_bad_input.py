"""Bad requests get a 4xx in the dialect's own error shape, and nothing reaches the store."""

from __future__ import annotations

import gzip
import json

import pytest

from gateway.tenants import hash_key
from loadtests.fake_upstream import ScriptedReply
from tests.gateway.conftest import store_at

OPENAI_BAD = [
    ("not json", b"{oops", 400),
    ("not an object", b"[1, 2]", 400),
    ("messages not a list", b'{"model": "m", "messages": "hi"}', 400),
    ("unknown role", b'{"model": "m", "messages": [{"role": "wizard", "content": "x"}]}', 400),
    ("content wrong type", b'{"model": "m", "messages": [{"role": "user", "content": 5}]}', 400),
    (
        "tool result without its call",
        b'{"model": "m", "messages": [{"role": "user", "content": "x"},'
        b' {"role": "tool", "tool_call_id": "nope", "content": "r"}]}',
        400,
    ),
]
ANTHROPIC_BAD = [
    ("not json", b"{oops", 400),
    ("missing max_tokens", b'{"model": "m", "messages": [{"role": "user", "content": "x"}]}', 400),
    (
        "unknown role",
        b'{"model": "m", "max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]}',
        400,
    ),
    (
        "tool result without its call",
        b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content":'
        b' [{"type": "tool_result", "tool_use_id": "nope", "content": "r"}]}]}',
        400,
    ),
]


@pytest.mark.parametrize(("why", "raw", "status"), OPENAI_BAD, ids=[c[0] for c in OPENAI_BAD])
async def test_openai_bad_input(gateway_with_fake, client, store_url, why, raw, status):
    async with gateway_with_fake() as (url, fake):
        resp = await client.post(
            f"{url}/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
        )
        assert resp.status_code == status, why
        err = resp.json()["error"]
        assert err["type"] == "invalid_request_error" and err["message"]
        assert fake.requests == []
    async with store_at(store_url) as store:
        assert await store.list_sessions("default") == []


@pytest.mark.parametrize(("why", "raw", "status"), ANTHROPIC_BAD, ids=[c[0] for c in ANTHROPIC_BAD])
async def test_anthropic_bad_input(gateway_with_fake, client, store_url, why, raw, status):
    async with gateway_with_fake() as (url, fake):
        resp = await client.post(f"{url}/v1/messages", content=raw)
        assert resp.status_code == status, why
        body = resp.json()
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        assert fake.requests == []
    async with store_at(store_url) as store:
        assert await store.list_sessions("default") == []


async def test_oversized_body_is_413(gateway_with_fake, client, store_url):
    big = b'{"model": "m", "messages": [{"role": "user", "content": "' + b"x" * 5000 + b'"}]}'
    async with gateway_with_fake(max_body_bytes=1000) as (url, fake):
        resp = await client.post(f"{url}/v1/chat/completions", content=big)
        assert resp.status_code == 413
        assert resp.json()["error"]["type"] == "request_too_large"
        resp = await client.post(f"{url}/v1/messages", content=big)
        assert resp.status_code == 413
        assert resp.json()["type"] == "error"
        assert fake.requests == []
    async with store_at(store_url) as store:
        assert await store.list_sessions("default") == []


async def test_unknown_strategy_header_is_400(gateway_with_fake, client):
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    async with gateway_with_fake() as (url, fake):
        resp = await client.post(
            f"{url}/v1/chat/completions", json=body, headers={"x-foldgate-strategy": "magic"}
        )
        assert resp.status_code == 400
        assert "magic" in resp.json()["error"]["message"]
        assert fake.requests == []


async def test_api_keys_map_to_tenants(gateway_with_fake, client, store_url):
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    async with gateway_with_fake(api_keys={hash_key("k-acme"): "acme"}) as (url, fake):
        resp = await client.post(f"{url}/v1/chat/completions", json=body)
        assert resp.status_code == 401
        assert resp.json()["error"]["type"] == "authentication_error"
        resp = await client.post(
            f"{url}/v1/chat/completions",
            json=body,
            headers={"authorization": "Bearer k-acme", "x-session-id": "s"},
        )
        assert resp.status_code == 200
        assert len(fake.requests) == 1
    async with store_at(store_url) as store:
        assert await store.list_sessions("acme") == ["s"]
        assert await store.list_sessions("default") == []


async def test_upstream_error_is_passed_in_dialect_shape(gateway_with_fake, client):
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    async with gateway_with_fake([ScriptedReply(status=400)]) as (url, fake):
        resp = await client.post(f"{url}/v1/chat/completions", json=body)
        assert resp.status_code == 400
        assert resp.json()["error"]["message"].startswith("upstream")
        assert len(fake.requests) == 1, "a 4xx from the upstream is not retried"


async def test_response_headers_report_session_replica_and_tokens(gateway_with_fake, client):
    dup = "line\n" * 400
    calls = [
        {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
        for i in range(20)
    ]
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    for call in calls:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": dup})
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    async with gateway_with_fake() as (url, fake):
        resp = await client.post(
            f"{url}/v1/chat/completions",
            json={"model": "m", "messages": messages, "tools": tools},
            headers={"x-session-id": "hdr-test"},
        )
        assert resp.status_code == 200
        assert resp.headers["x-foldgate-session"] == "hdr-test"
        assert resp.headers["x-foldgate-replica"].startswith("replica-")
        assert fake.url not in resp.headers.values()  # no internal address without debug
        raw = int(resp.headers["x-foldgate-prompt-tokens-raw"])
        rendered = int(resp.headers["x-foldgate-prompt-tokens-rendered"])
        assert rendered < raw / 2


async def test_context_too_long_walks_the_cliff_ladder_and_retries(gateway_with_fake, client):
    too_long = ScriptedReply(
        status=400,
        error_message="This model's maximum context length is 4096 tokens. However, you "
        "requested 9000 tokens in the messages.",
    )
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]
    for i in range(12):
        messages.append({"role": "assistant", "content": f"thinking about part {i} " * 40})
        messages.append({"role": "user", "content": f"observation {i} " * 200})
    async with gateway_with_fake([too_long]) as (url, fake):
        resp = await client.post(
            f"{url}/v1/chat/completions", json={"model": "m", "messages": messages}
        )
        assert resp.status_code == 200, resp.text
        assert len(fake.requests) == 2
        first, retried = (len(json.dumps(r["messages"])) for r in fake.requests)
        assert retried < first / 2
        kept = fake.requests[1]["messages"]
        assert kept[0]["role"] == "system" and kept[1] == {"role": "user", "content": "task"}


async def test_a_compressed_body_is_a_415_naming_content_encoding(
    gateway_with_fake, client, store_url
):
    """The body is read as sent: a gzip one would be a 400 for bytes that are not JSON, a
    plain one under the claim would be read against what the client said it sent."""
    plain = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]}).encode()
    async with gateway_with_fake() as (url, fake):
        for body in (gzip.compress(plain), plain):
            resp = await client.post(
                f"{url}/v1/chat/completions",
                content=body,
                headers={"content-type": "application/json", "content-encoding": "gzip"},
            )
            assert resp.status_code == 415
            err = resp.json()["error"]
            assert err["param"] == "content-encoding" and "'gzip'" in err["message"]
        assert fake.requests == []
    async with store_at(store_url) as store:
        assert await store.list_sessions("default") == []
    async with gateway_with_fake() as (url, fake):
        for encoding in ("identity", ""):  # no coding: read as sent
            resp = await client.post(
                f"{url}/v1/chat/completions",
                content=plain,
                headers={"content-type": "application/json", "content-encoding": encoding},
            )
            assert resp.status_code == 200, encoding
