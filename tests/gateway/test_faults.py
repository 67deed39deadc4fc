"""Faults under load through a real gateway and a real store, in front of the FAKE upstream
(the faults are injected: a 5xx, a SIGKILLed Redis, a SIGKILLed gateway process).

- one upstream 5xx does not take a healthy replica out; repeated ones do, and the replica
  comes back by itself;
- Redis SIGKILLed and restarted while 8 sessions run (every dialect): no acknowledged turn
  is lost, and during the outage every refusal is a 503 with ``Retry-After`` in the
  dialect's error shape;
- a gateway process SIGKILLed and started again: its sessions continue from the store.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from deploy.cpu.replicas import free_ports
from gateway.config import DEFAULT_TENANT, GatewayConfig
from gateway.exposure import ReplicaLabels
from loadtests.fake_upstream import FakeUpstream, ScriptedReply
from loadtests.local_servers import RedisServer, running_gateway
from tests.gateway.conftest import gateway_process, store_at

needs_redis_server = pytest.mark.skipif(
    shutil.which("redis-server") is None, reason="needs a local redis-server binary to kill"
)


@dataclass(frozen=True)
class Dialect:
    """How a harness of one API sends its history and reads a reply and an error."""

    path: str
    body: Callable[[list[dict[str, Any]]], dict[str, Any]]
    reply: Callable[[dict[str, Any]], list[dict[str, Any]]]  # the items it sends back
    error: Callable[[dict[str, Any]], dict[str, Any]]  # the error object, shape checked


def _openai_error(body: dict[str, Any]) -> dict[str, Any]:
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def _anthropic_error(body: dict[str, Any]) -> dict[str, Any]:
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    return body["error"]


CHAT = Dialect(
    "/v1/chat/completions",
    lambda history: {"model": "m", "messages": history},
    lambda reply: [reply["choices"][0]["message"]],
    _openai_error,
)
MESSAGES = Dialect(
    "/v1/messages",
    lambda history: {"model": "m", "max_tokens": 16, "messages": history},
    lambda reply: [{"role": "assistant", "content": reply["content"]}],
    _anthropic_error,
)
RESPONSES = Dialect(
    "/v1/responses",
    lambda history: {"model": "m", "input": history},
    lambda reply: reply["output"],
    _openai_error,
)
DIALECTS = (CHAT, MESSAGES, RESPONSES)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


# Keys the replicas' labels (``gateway.exposure.ReplicaLabels``), so tests can name them.
SECRET = "labels-secret"


def counter(metrics_text: str, name: str, labels: dict[str, str]) -> float | None:
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return None


# --- one 5xx --------------------------------------------------------------------------


async def test_one_upstream_5xx_does_not_take_the_only_replica_out(gateway_with_fake, client):
    async with gateway_with_fake([ScriptedReply(status=500)], debug=True) as (url, fake):
        failed = await client.post(f"{url}/v1/chat/completions", json=CHAT.body([user("a")]))
        after = await asyncio.gather(
            *(
                client.post(
                    f"{url}{d.path}",
                    json=d.body([user(f"tenant work {i}")]),
                    headers={"x-session-id": f"s{i}"},
                )
                for i, d in enumerate(DIALECTS * 5)
            )
        )
        health = await client.get(f"{url}/health")
        metrics = (await client.get(f"{url}/metrics")).text
    assert failed.status_code == 502, failed.text
    assert CHAT.error(failed.json())["message"]
    assert [r.status_code for r in after] == [200] * 15
    assert health.status_code == 200 and health.json()["healthy_replicas"] == [fake.url]
    state = {"replica": fake.url}
    assert counter(metrics, "foldgate_router_breaker_state", state) == 0
    assert not counter(metrics, "foldgate_router_breaker_opened_total", state)


async def test_a_replica_failing_repeatedly_is_taken_out_and_comes_back(gateway_with_fake, client):
    script = [ScriptedReply(status=503)] * 3
    async with gateway_with_fake(
        script, breaker_failures=3, breaker_open_s=0.5, cache_salt_secret=SECRET
    ) as (url, fake):
        failed = [
            (await client.post(f"{url}/v1/messages", json=MESSAGES.body([user("x")]))).status_code
            for _ in range(3)
        ]
        out = await client.post(f"{url}/v1/messages", json=MESSAGES.body([user("x")]))
        while_out = len(fake.requests)
        await asyncio.sleep(0.5)
        back = await client.post(f"{url}/v1/messages", json=MESSAGES.body([user("x")]))
        metrics = (await client.get(f"{url}/metrics")).text
    assert failed == [502] * 3
    assert out.status_code == 503 and int(out.headers["retry-after"]) >= 1
    assert MESSAGES.error(out.json())["type"] == "overloaded_error"
    assert while_out == 3  # the open breaker kept the request away from the replica
    assert back.status_code == 200, back.text  # the half-open trial closed it
    state = {"replica": ReplicaLabels(SECRET).label(fake.url)}
    assert counter(metrics, "foldgate_router_breaker_state", state) == 0
    assert counter(metrics, "foldgate_router_breaker_opened_total", state) == 1


async def test_replies_breaking_off_after_the_first_chunk_take_the_replica_out(
    store_url: str, client: httpx.AsyncClient
) -> None:
    """An idle timeout between chunks, a dropped connection and an error event, each after
    the first chunk: three failures in a row of one replica, which its breaker takes out."""
    stalls = ScriptedReply(content="x" * 40, chunk_delay_s=1.0)  # past the idle timeout
    script = [stalls, ScriptedReply(breaks="drop"), ScriptedReply(breaks="error")]
    fake = await FakeUpstream(script).start()
    config = GatewayConfig(
        store_url=store_url,
        replicas=(fake.url,),
        probe_interval_s=0.5,
        upstream_idle_timeout_s=0.2,
        breaker_failures=3,
        breaker_open_s=30.0,
        cache_salt_secret=SECRET,
    )
    try:
        async with running_gateway(config) as url:
            broken = [
                await client.post(f"{url}/v1/chat/completions", json=CHAT.body([user(f"{i}")]))
                for i in range(3)
            ]
            out = await client.post(f"{url}/v1/chat/completions", json=CHAT.body([user("x")]))
            metrics = (await client.get(f"{url}/metrics")).text
    finally:
        await fake.stop()
    assert [r.status_code for r in broken] == [502] * 3, [r.text for r in broken]
    assert out.status_code == 503 and CHAT.error(out.json())["type"] == "overloaded_error"
    assert 29 <= int(out.headers["retry-after"]) <= 30  # the breaker's next trial
    assert len(fake.requests) == 3  # the open breaker kept the fourth away
    state = {"replica": ReplicaLabels(SECRET).label(fake.url)}
    assert counter(metrics, "foldgate_router_breaker_state", state) == 2
    assert counter(metrics, "foldgate_router_breaker_opened_total", state) == 1


# --- Redis SIGKILLed under load -----------------------------------------------------------

SESSIONS = 8
TURNS = 12
OUTAGE_S = 1.0


@needs_redis_server
async def test_redis_sigkilled_during_8_sessions_loses_no_acknowledged_turn(tmp_path):
    # AOF fsynced on every write: what Redis acknowledged is on disk when it is killed.
    redis = RedisServer(
        tmp_path / "redis", "--save", "", "--appendonly", "yes", "--appendfsync", "always"
    )
    redis.start()
    fake = await FakeUpstream().start()
    config = GatewayConfig(store_url=redis.url, replicas=(fake.url,), probe_interval_s=0.5)
    tag = uuid.uuid4().hex[:8]
    acknowledged: dict[str, list[str]] = {}  # session -> user texts of its 200s
    outage: list[httpx.Response] = []
    turns_done = 0
    killed = asyncio.Event()

    async def session(index: int, url: str, client: httpx.AsyncClient) -> None:
        nonlocal turns_done
        dialect = DIALECTS[index % len(DIALECTS)]
        name = f"{tag}-{index}"
        history: list[dict[str, Any]] = []
        acknowledged[name] = []
        for turn in range(TURNS):
            text = f"{name} turn {turn}"
            history.append(user(text))
            while True:
                resp = await client.post(
                    f"{url}{dialect.path}",
                    json=dialect.body(history),
                    headers={"x-session-id": name},
                )
                if resp.status_code == 200:
                    break
                outage.append(resp)
                assert resp.status_code == 503, resp.text
                assert int(resp.headers["retry-after"]) >= 1
                assert "store unavailable" in dialect.error(resp.json())["message"]
                await asyncio.sleep(0.1)  # a harness waits Retry-After; this test less
            acknowledged[name].append(text)
            history += dialect.reply(resp.json())
            turns_done += 1

    async def kill_redis_midway() -> None:
        while turns_done < SESSIONS * TURNS // 3:
            await asyncio.sleep(0.01)
        redis.kill()
        killed.set()
        await asyncio.sleep(OUTAGE_S)
        await asyncio.to_thread(redis.start)  # same port, same append-only file

    started = time.monotonic()
    try:
        async with running_gateway(config) as url, httpx.AsyncClient(timeout=30) as client:
            await asyncio.wait_for(
                asyncio.gather(
                    kill_redis_midway(), *(session(i, url, client) for i in range(SESSIONS))
                ),
                timeout=60,
            )
        lost = 0
        async with store_at(redis.url) as store:
            for name, texts in acknowledged.items():
                stored = await store.load(DEFAULT_TENANT, name)
                kept = [
                    m["parts"][0]["text"]
                    for m in stored.messages
                    if m["role"] == "user" and m["parts"]
                ]
                lost += len([t for t in texts if t not in kept])
                assert stored.branch_id == 0, f"{name} forked: a retried turn was not recognised"
    finally:
        await fake.stop()
        redis.stop()
    total = sum(len(t) for t in acknowledged.values())
    print(
        f"\nRedis SIGKILLed for {OUTAGE_S:g} s during {SESSIONS} sessions: {total} turns "
        f"acknowledged, {lost} lost; {len(outage)} refused with 503 + Retry-After; "
        f"{time.monotonic() - started:.1f} s"
    )
    assert killed.is_set() and total == SESSIONS * TURNS
    assert lost == 0
    assert outage, "the outage refused no request: Redis was not down while sessions ran"


@needs_redis_server
async def test_redis_lost_while_a_reply_is_kept_is_a_503_not_a_502(tmp_path):
    """A non-streaming Responses reply is kept in the store before it is answered; Redis
    dies meanwhile: nothing reached the client, so the answer is the outage's own 503 with
    Retry-After, and it names no internal address."""
    redis = RedisServer(tmp_path / "redis")
    redis.start()
    # a reply that takes a while to stream, so Redis can die after the history was stored
    slow = ScriptedReply("x" * 64, chunk_delay_s=0.05)
    fake = await FakeUpstream(default=slow).start()
    config = GatewayConfig(store_url=redis.url, replicas=(fake.url,), probe_interval_s=0.5)
    try:
        async with running_gateway(config) as url, httpx.AsyncClient(timeout=30) as client:
            request = asyncio.create_task(
                client.post(f"{url}/v1/responses", json={"model": "m", "input": "keep me"})
            )
            while not fake.requests:
                await asyncio.sleep(0.01)
            redis.kill()
            resp = await request
    finally:
        await fake.stop()
        redis.stop()
    assert resp.status_code == 503, resp.text
    assert int(resp.headers["retry-after"]) >= 1
    assert RESPONSES.error(resp.json())["type"] == "overloaded_error"
    assert "127.0.0.1" not in resp.text


# --- a gateway process SIGKILLed and started again ------------------------------------


async def requests_counted(store_url: str, sessions: list[str], n: int) -> None:
    """Wait (5 s at most) until each session's request counter says ``n``."""
    async with store_at(store_url) as store:
        for _ in range(100):
            counts = [
                (await store.get_counts(DEFAULT_TENANT, s, 0)).get("requests") for s in sessions
            ]
            if counts == [n] * len(sessions):
                return
            await asyncio.sleep(0.05)
    raise AssertionError(f"request counters {counts}, expected {n} each")


async def test_sessions_continue_from_the_store_after_a_gateway_restart(redis_url, tmp_path):
    """Redis: the deployment where gateway processes come and go (a SQLite gateway that
    restarts reopens its file, which the store contract tests cover)."""
    store_url = redis_url
    fake = await FakeUpstream().start()
    config = GatewayConfig(store_url=store_url, replicas=(fake.url,))
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}"
    names = [f"restart-{uuid.uuid4().hex[:8]}-{d.path.rsplit('/', 1)[1]}" for d in DIALECTS]
    histories: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    kept_reply: str | None = None

    async def turn(client: httpx.AsyncClient, name: str, dialect: Dialect, text: str) -> Any:
        histories[name].append(user(text))
        resp = await client.post(
            f"{url}{dialect.path}",
            json=dialect.body(histories[name]),
            headers={"x-session-id": name},
        )
        assert resp.status_code == 200, resp.text
        histories[name] += dialect.reply(resp.json())
        return resp

    try:
        async with httpx.AsyncClient(timeout=30) as client:
            async with gateway_process(config, tmp_path, port) as (_, first):
                for step in range(3):
                    for name, dialect in zip(names, DIALECTS, strict=True):
                        resp = await turn(client, name, dialect, f"{name} step {step}")
                kept_reply = resp.json()["id"]  # the last Responses reply, kept in the store
                # accounting runs after each reply: let it land (a kill loses it otherwise)
                await requests_counted(store_url, names, 3)
                first.send_signal(signal.SIGKILL)
                first.wait(10)
            async with gateway_process(config, tmp_path, port):
                for name, dialect in zip(names, DIALECTS, strict=True):
                    await turn(client, name, dialect, f"{name} step 3")
                # a reply kept by the killed process continues in the new one
                follow = await client.post(
                    f"{url}/v1/responses",
                    json={"model": "m", "input": "and then?", "previous_response_id": kept_reply},
                )
                listed = (await client.get(f"{url}/v1/sessions")).json()["data"]
        assert follow.status_code == 200, follow.text
        await requests_counted(store_url, names, 4)  # counted by both processes
        async with store_at(store_url) as store:
            for name in names:
                stored = await store.load(DEFAULT_TENANT, name, 0)
                # what the harness sent: every turn, the last one's reply not yet re-sent
                assert [m["role"] for m in stored.messages] == ["user", "assistant"] * 3 + ["user"]
            followed = await store.load(DEFAULT_TENANT, names[2])
            assert followed.messages[-1]["parts"][0]["text"] == "and then?"
            assert len(followed.messages) == 3 * 2 + 1  # forked at the kept reply, then appended
    finally:
        await fake.stop()
    assert set(names) <= {s["id"] for s in listed}
