"""The replicas' KV events through a real gateway in front of a FAKE upstream, with a real
ZMQ publisher standing in for the replica's (vLLM's event shape, as tests/router/data
holds it): the session's name goes upstream, and whether its prefix is still on its
replica decides its priority class."""

from __future__ import annotations

import asyncio
import uuid

import httpx
import msgpack
import zmq
import zmq.asyncio

from gateway.config import GatewayConfig
from loadtests.fake_upstream import FakeUpstream
from loadtests.local_servers import running_gateway
from router.kv_events import session_key

BLOCK = 2048  # one block covers the whole test prompt
TOKENS = list(range(BLOCK))
HASH = b"h" * 32  # the replica's name of the block (the gateway never computes one)


def stored(session_id: str) -> bytes:
    event = {
        "type": "BlockStored",
        "block_hashes": [HASH],
        "parent_block_hash": None,
        "token_ids": TOKENS,
        "block_size": BLOCK,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "extra_keys": [None],  # unsalted: a gateway without API keys sends no cache_salt
        "group_idx": 0,
        "session_id": session_id,
    }
    return msgpack.packb([1.0, [event], None])


REMOVED = msgpack.packb([2.0, [{"type": "BlockRemoved", "block_hashes": [HASH], "medium": "GPU"}]])


async def test_a_prefix_the_events_say_is_held_is_warm_and_one_evicted_is_cold(tmp_path):
    fake = await FakeUpstream().start()
    context = zmq.asyncio.Context()
    pub = context.socket(zmq.PUB)
    events_port = pub.bind_to_random_port("tcp://127.0.0.1")
    session = f"kv-{uuid.uuid4().hex[:6]}"
    key = session_key("default", session)
    config = GatewayConfig(
        store_url=f"sqlite:///{tmp_path}/store.db",
        replicas=(fake.url,),
        probe_interval_s=0.5,
        kv_events=True,
        kv_events_port_offset=events_port - fake.port,
        upstream_priority=True,
    )
    messages = [{"role": "system", "content": "agent " + "y" * 2000}]
    try:
        async with running_gateway(config) as url, httpx.AsyncClient(timeout=30) as http:

            async def step(n: int) -> int:
                messages.append({"role": "user", "content": f"step {n}"})
                resp = await http.post(
                    f"{url}/v1/chat/completions",
                    json={"model": "m", "messages": messages, "max_tokens": 4},
                    headers={"x-session-id": session, "x-foldgate-strategy": "base"},
                )
                assert resp.status_code == 200, resp.text
                messages.append({"role": "assistant", "content": "ok"})
                body = fake.requests[-1]
                assert body["session_id"] == key  # what vLLM tags the session's events with
                return body["priority"]

            assert await step(0) == 1  # a cold start; the gateway subscribes now
            # A session its replica's events never named counts as warm when it continues
            # (the gateway knows nothing against it), so only a cold answer proves the events
            # arrive. Nothing acknowledges a delivery over PUB/SUB (and a subscription takes
            # a moment to reach the publisher): each phase publishes until a request shows it.
            seq = iter(range(1, 1000))

            async def until(priority: int, *payloads: bytes) -> None:
                seen = []
                for _ in range(100):
                    for payload in payloads:
                        await pub.send_multipart((b"kv", next(seq).to_bytes(8, "big"), payload))
                    await asyncio.sleep(0.02)
                    seen.append(await step(len(messages)))
                    if seen[-1] == priority:
                        return
                raise AssertionError(f"never priority {priority}: {seen}")

            await until(1, stored(key), REMOVED)  # named, then evicted: cold
            await until(0, stored(key))  # on its replica again: warm
            await until(1, REMOVED)  # evicted: cold
    finally:
        pub.close(0)
        context.term()
        await fake.stop()
