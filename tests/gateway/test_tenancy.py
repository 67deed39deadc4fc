"""Tenants through the gateway (FAKE upstream, real store): keys checked before the body,
nothing shared across tenants, the tenant's cache salt on every upstream body."""

from __future__ import annotations

import asyncio
import hashlib
import hmac

import pytest

from gateway.app import create_app
from gateway.config import GatewayConfig
from gateway.tenants import hash_key
from loadtests.fake_upstream import ScriptedReply
from tests.gateway.conftest import store_at
from tests.gateway.test_restore_loop import text_history

SECRET = "salt-secret-for-tests"
KEYS = {hash_key("key-acme"): "acme", hash_key("key-beta"): "beta"}
ACME = {"authorization": "Bearer key-acme"}
BETA = {"x-api-key": "key-beta"}


def salt(tenant: str) -> str:
    """The salt as its definition says (HMAC-SHA256 of the length-prefixed tenant id)."""
    name = tenant.encode()
    message = b"foldgate cache_salt v1\x00" + len(name).to_bytes(8, "big") + name
    return hmac.new(SECRET.encode(), message, hashlib.sha256).hexdigest()


def chat(text: str, **extra) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": text}], **extra}


def tenant_config(**overrides) -> dict:
    return {"api_keys": KEYS, "cache_salt_secret": SECRET, **overrides}


async def test_unauthenticated_requests_never_reach_the_decoder(gateway_with_fake, client):
    async with gateway_with_fake(**tenant_config()) as (url, fake):
        # a body that is not even JSON: 401, not 400, so it was never parsed
        for path, shape in (("/v1/chat/completions", "openai"), ("/v1/messages", "anthropic")):
            resp = await client.post(
                f"{url}{path}", content=b"{not json", headers={"x-api-key": "wrong"}
            )
            assert resp.status_code == 401, resp.text
            body = resp.json()
            if shape == "openai":
                assert body["error"]["type"] == "authentication_error"
            else:
                assert body["type"] == "error"
                assert body["error"]["type"] == "authentication_error"
        # a client that announces a body and never sends it is answered at once
        reader, writer = await asyncio.open_connection(*url.removeprefix("http://").split(":"))
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
            b"\r\ncontent-length: 100000\r\n\r\n{"
        )
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), 5)
        writer.close()
        assert status.startswith(b"HTTP/1.1 401"), status
        # a key's hash is not a key
        resp = await client.post(
            f"{url}/v1/chat/completions",
            json=chat("x"),
            headers={"x-api-key": hash_key("key-acme")},
        )
        assert resp.status_code == 401
        assert fake.requests == []


async def test_plain_keys_in_the_config_are_refused_at_startup():
    with pytest.raises(ValueError, match="foldgate keys hash"):
        create_app(GatewayConfig(api_keys={"sk-plain": "acme"}))


async def test_sessions_of_one_id_stay_apart_per_tenant(gateway_with_fake, client, store_url):
    async with gateway_with_fake(**tenant_config()) as (url, fake):
        for headers, text in ((ACME, "acme's secret plan"), (BETA, "beta's question")):
            resp = await client.post(
                f"{url}/v1/chat/completions",
                json=chat(text),
                headers={**headers, "x-session-id": "shared-id"},
            )
            assert resp.status_code == 200, resp.text
        # beta continues "its" session with acme's history: it lands in beta's own session
        resp = await client.post(
            f"{url}/v1/chat/completions",
            json={
                "model": "m",
                "messages": [
                    {"role": "user", "content": "acme's secret plan"},
                    {"role": "assistant", "content": "ok"},
                    {"role": "user", "content": "and more"},
                ],
            },
            headers={**BETA, "x-session-id": "shared-id"},
        )
        assert resp.status_code == 200
        assert "acme's secret plan" not in str(fake.requests[1])
    async with store_at(store_url) as store:
        assert await store.list_sessions("acme") == ["shared-id"]
        assert await store.list_sessions("beta") == ["shared-id"]
        acme = await store.load("acme", "shared-id")
        assert [m["parts"][0]["text"] for m in acme.messages] == ["acme's secret plan"]
        beta = await store.load("beta", "shared-id", 0)
        assert [m["parts"][0]["text"] for m in beta.messages] == ["beta's question"]
        # the continuation forked beta's own session; acme's is as it was
        assert len((await store.load("beta", "shared-id")).messages) == 3
        assert (await store.get_counts("acme", "shared-id", 0))["requests"] == 1
        assert (await store.get_tenant_counts("beta"))["requests"] == 2


async def test_a_restore_reads_only_the_tenants_own_history(gateway_with_fake, client):
    script = [
        ScriptedReply("ok"),
        ScriptedReply("Again.\n```bash\nrestore 0\n```"),
        ScriptedReply("done"),
    ]
    async with gateway_with_fake(script, **tenant_config()) as (url, fake):
        acme_history = text_history()
        acme_history[-1] = {"role": "user", "content": "ACME-PRIVATE-OUTPUT " * 20}
        for headers, history in ((ACME, acme_history), (BETA, text_history())):
            resp = await client.post(
                f"{url}/v1/chat/completions",
                json={"model": "m", "messages": history},
                # the paper's setting: restores are offered from the first request
                headers={**headers, "x-session-id": "t1", "x-foldgate-fold": "on"},
            )
            assert resp.status_code == 200, resp.text
        restored = fake.requests[2]["messages"][-1]["content"]
    assert "[restored step 0]" in restored and "ACME-PRIVATE-OUTPUT" not in restored


async def test_upstream_bodies_carry_the_tenants_salt_never_the_clients(gateway_with_fake, client):
    tenants = {"beta": {"upstream_fields": ["priority"]}}
    async with gateway_with_fake(**tenant_config(tenants=tenants)) as (url, fake):
        extras = {
            "cache_salt": "chosen-by-client",
            "priority": -10,
            "kv_transfer_params": {"do_remote_prefill": True},
            "ignore_eos": True,
            "min_tokens": 4,
        }
        for headers in (ACME, BETA):
            for path, body in (
                ("/v1/chat/completions", chat("hi", **extras)),
                ("/v1/messages", {**chat("hi", **extras), "max_tokens": 8}),
            ):
                resp = await client.post(f"{url}{path}", json=body, headers=headers)
                assert resp.status_code == 200, resp.text
        sent = fake.requests
    assert [b["cache_salt"] for b in sent] == [salt("acme")] * 2 + [salt("beta")] * 2
    assert salt("acme") != salt("beta")
    for body in sent:
        assert body["ignore_eos"] is True and body["min_tokens"] == 4
        assert "kv_transfer_params" not in body  # allowed for nobody
    assert ["priority" in b for b in sent] == [False, False, True, True]


async def test_without_keys_one_tenant_and_no_client_salt(gateway_with_fake, client, caplog):
    async with gateway_with_fake() as (url, fake):
        resp = await client.post(
            f"{url}/v1/chat/completions", json=chat("hi", cache_salt="mine", priority=3)
        )
        assert resp.status_code == 200
    assert "cache_salt" not in fake.requests[0] and "priority" not in fake.requests[0]
    assert "every client shares tenant 'default'" in caplog.text


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
async def test_64_concurrent_identical_requests_are_all_counted(
    gateway_with_fake, client, backend, request
):
    store_url = request.getfixturevalue("store_url")
    if backend == "redis":
        store_url = request.getfixturevalue("redis_url")
    tenant = f"count-{backend}-{request.node.name[-8:]}-{id(request)}"
    keys = {hash_key(f"key-{tenant}"): tenant}
    body = chat("the same request")
    headers = {"x-api-key": f"key-{tenant}", "x-session-id": "one"}
    async with gateway_with_fake(store_url=store_url, api_keys=keys) as (url, _fake):
        replies = await asyncio.gather(
            *(
                client.post(f"{url}/v1/chat/completions", json=body, headers=headers)
                for _ in range(64)
            )
        )
        assert [r.status_code for r in replies] == [200] * 64
    async with store_at(store_url) as store:
        counts = await store.get_counts(tenant, "one", 0)
        tenant_counts = await store.get_tenant_counts(tenant)
    print(f"\n64 concurrent identical requests, {backend}: session counter {counts['requests']}")
    assert counts["requests"] == 64 and tenant_counts["requests"] == 64
    # identical requests: each reported the same prompt tokens, all of them added
    assert counts["upstream_prompt_tokens"] % 64 == 0 and counts["upstream_prompt_tokens"] > 0


def test_tenant_settings_are_checked_at_startup():
    from gateway.tenants import Tenants

    for table, message in (
        ({"acme": {"requests_per_minte": 5}}, "unknown keys requests_per_minte"),
        ({"acme": {"sessions": 0}}, "sessions must be a positive integer"),
        ({"acme": {"strategy": "refol"}}, "'refol' is not one of"),
        ({"acme": {"upstream_fields": ["cache_salt"]}}, "upstream_fields"),
        ({"acme": {"policy": "random"}}, "'random' is not one of"),
        ({"acme": {"budget": -5}}, "budget must be a positive integer"),
    ):
        with pytest.raises(ValueError, match=message):
            Tenants(table, None)
    tenants = Tenants({"*": {"sessions": 3}, "acme": {"sessions": 9}}, SECRET.encode())
    assert (tenants.settings("acme").sessions, tenants.settings("other").sessions) == (9, 3)
    # salts: one per tenant id, stable, and unguessable without the secret
    assert tenants.cache_salt("acme") == salt("acme") != tenants.cache_salt("acme ")
    assert Tenants({}, b"another secret").cache_salt("acme") != salt("acme")


async def test_tenant_defaults_for_budget_and_routing_policy(store_url, client):
    """acme: cliff at a 300-token budget, round-robin; beta: the gateway's defaults (refold,
    sticky, no budget); gamma has a table without those keys, so the gateway's too."""
    from loadtests.fake_upstream import FakeUpstream
    from tests.gateway.conftest import running_gateway

    keys = {**KEYS, hash_key("key-gamma"): "gamma"}
    tenants = {
        "acme": {"strategy": "cliff", "budget": 300, "policy": "round_robin"},
        "gamma": {"requests_per_minute": 1000},
    }
    fakes = [await FakeUpstream().start() for _ in range(2)]
    config = GatewayConfig(
        store_url=store_url,
        replicas=tuple(f.url for f in fakes),
        probe_interval_s=0.5,
        **tenant_config(tenants=tenants | {"*": {"policy": "least_loaded"}}, api_keys=keys),
    )
    history = []
    for i in range(12):
        history += [
            {"role": "user", "content": f"question {i} " + "word " * 60},
            {"role": "assistant", "content": f"answer {i}"},
        ]
    history.append({"role": "user", "content": "last question"})
    served: dict[str, list[str]] = {}
    try:
        async with running_gateway(config) as url:
            for name, headers in (
                ("acme", ACME),
                ("beta", BETA),
                ("gamma", {"x-api-key": "key-gamma"}),
            ):
                for _ in range(4):
                    resp = await client.post(
                        f"{url}/v1/chat/completions",
                        json={"model": "m", "messages": history},
                        headers={**headers, "x-session-id": "s"},
                    )
                    assert resp.status_code == 200, resp.text
                    served.setdefault(name, []).append(resp.headers["x-foldgate-replica"])
                    rendered = int(resp.headers["x-foldgate-prompt-tokens-rendered"])
                    raw = int(resp.headers["x-foldgate-prompt-tokens-raw"])
                    assert (rendered < raw / 2) if name == "acme" else rendered >= raw, name
    finally:
        for fake in fakes:
            await fake.stop()
    assert len(set(served["acme"][:2])) == 2  # round-robin: turns alternate
    # beta has no table: "*" routes it least-loaded, and idle replicas tie, so they take turns
    assert len(set(served["beta"][:2])) == 2
    assert len(set(served["gamma"])) == 1  # the gateway's sticky policy


def test_routing_policies_per_tenant_from_the_table():
    from gateway.tenants import routing_policies

    table = {"a": {"policy": "round_robin"}, "b": {"sessions": 3}, "c": {"policy": "sticky"}}
    assert routing_policies(table, "sticky") == ("sticky", {"a": "round_robin"})
    star = {**table, "*": {"policy": "least_loaded"}}
    # a tenant's own table replaces "*": b and c take the gateway's policy
    assert routing_policies(star, "sticky") == (
        "least_loaded",
        {"a": "round_robin", "b": "sticky", "c": "sticky"},
    )


async def test_a_kept_reply_continues_only_for_its_own_tenant(gateway_with_fake, client):
    async with gateway_with_fake(**tenant_config()) as (url, fake):
        kept = await client.post(
            f"{url}/v1/responses", json={"model": "m", "input": "acme's plan"}, headers=ACME
        )
        assert kept.status_code == 200, kept.text
        reply_id = kept.json()["id"]
        body = {"model": "m", "input": "go on", "previous_response_id": reply_id}
        stolen = await client.post(f"{url}/v1/responses", json=body, headers=BETA)
        own = await client.post(f"{url}/v1/responses", json=body, headers=ACME)
        sent = [str(r["messages"]) for r in fake.requests]
    assert stolen.status_code == 400
    assert stolen.json()["error"]["code"] == "previous_response_not_found"
    assert own.status_code == 200
    assert len(sent) == 2 and "acme's plan" in sent[1]  # beta's attempt reached no replica
