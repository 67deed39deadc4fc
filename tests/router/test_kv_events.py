"""vLLM's KV events as its ZMQ publisher encodes them (tests/router/data: payloads encoded
by vLLM 0.32's own msgspec classes and block hasher, make_vllm_kv_events.py), decoded into
what each replica holds of each session; the subscriber over a real ZMQ socket."""

from __future__ import annotations

import asyncio
import hashlib
import json
import pickle
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from router.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEventError,
    KvIndex,
    decode_batch,
    session_key,
)
from router.kv_subscriber import KvEventSubscriber, events_endpoint


def vllm_block_hash(parent: bytes | None, tokens: list[int], extra: tuple | None) -> bytes:
    """vLLM 0.32's default block hash (hash_block_tokens over its pickled sha256), from its
    fixed seed: what the fixture's hashes are."""
    seed = hashlib.sha256(pickle.dumps("vllm-none-hash", protocol=pickle.HIGHEST_PROTOCOL))
    value = (parent or seed.digest(), tuple(tokens), extra)
    return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def prefix_hashes(tokens: list[int], size: int, salt: str | None = None) -> list[bytes]:
    hashes, parent = [], None
    for start in range(0, len(tokens) - size + 1, size):
        extra = (("cache_salt", salt),) if salt and start == 0 else None
        parent = vllm_block_hash(parent, tokens[start : start + size], extra)
        hashes.append(parent)
    return hashes


FIXTURE = json.loads((Path(__file__).parent / "data" / "vllm_kv_events.json").read_text())
SALT = FIXTURE["salt"]
HASHES = [bytes.fromhex(h) for h in FIXTURE["hashes"]]
PAYLOADS = [bytes.fromhex(p) for p in FIXTURE["payloads"]]


def test_the_salt_on_the_first_block_makes_every_block_of_a_tenant_its_own():
    """Why a chain keyed by its first block's salt keeps tenants apart: vLLM hashes the
    salt into block 0 and chains every later block from it."""
    tokens, size = FIXTURE["tokens"], FIXTURE["block_size"]
    assert prefix_hashes(tokens, size, SALT) == HASHES  # the fixture is vLLM's own hashing
    other = prefix_hashes(tokens, size, "b" * 64)
    assert not set(other) & set(HASHES) and not set(prefix_hashes(tokens, size)) & set(HASHES)


def test_vllms_encoding_decodes_into_stored_removed_and_cleared():
    ts, events = decode_batch(PAYLOADS[0])
    assert ts == 1.5
    first, more = events
    assert isinstance(first, BlockStored) and isinstance(more, BlockStored)
    assert first.block_hashes == tuple(HASHES[:2]) and first.parent is None
    assert first.first_salt == SALT and first.session_id == "fg-s1" and first.block_size == 4
    assert more.parent == HASHES[1] and more.first_salt is None
    assert decode_batch(PAYLOADS[1])[1] == [BlockRemoved((HASHES[2],))]
    assert decode_batch(PAYLOADS[2])[1] == [AllBlocksCleared()]


def test_not_a_batch_is_a_clear_error():
    with pytest.raises(KvEventError):
        decode_batch(b"\xc1")
    with pytest.raises(KvEventError):
        decode_batch(b"\x93\x01\x02\x03")  # [1, 2, 3]: no event list


def test_a_sessions_resident_prefix_follows_stores_removals_and_clears():
    index = KvIndex()
    assert index.resident_tokens("fg-s1", SALT) is None  # never named
    index.apply(decode_batch(PAYLOADS[0])[1])
    assert index.resident_tokens("fg-s1", SALT) == 12
    assert index.resident_tokens("fg-s1", "b" * 64) == 0  # another tenant's: not its prefix
    index.apply(decode_batch(PAYLOADS[1])[1])  # the last block evicted
    assert index.resident_tokens("fg-s1", SALT) == 8
    index.apply([BlockRemoved((HASHES[0],))])  # the first gone: nothing usable leads
    assert index.resident_tokens("fg-s1", SALT) == 0
    index.apply(decode_batch(PAYLOADS[0])[1])
    index.apply(decode_batch(PAYLOADS[2])[1])
    assert index.resident_tokens("fg-s1", SALT) == 0


def test_a_chain_whose_start_was_missed_counts_for_nobody():
    index = KvIndex()
    index.apply([BlockStored((b"y" * 32,), b"x" * 32, 4, None, "fg-s2")])
    assert index.resident_tokens("fg-s2", None) == 0


def test_a_chain_that_continues_another_sessions_blocks_is_known_from_block_zero():
    """A session whose first blocks another session stored (the same agent's system
    prompt): vLLM stores only its new blocks, parented on the shared one."""
    index = KvIndex()
    shared, own = b"p" * 32, (b"q" * 32, b"r" * 32)
    index.apply([BlockStored((shared,), None, 4, SALT, "fg-s1")])
    index.apply([BlockStored(own, shared, 4, None, "fg-s2")])
    assert index.resident_tokens("fg-s2", SALT) == 12
    assert index.resident_tokens("fg-s2", "b" * 64) == 0  # the shared block's salt counts
    index.apply([BlockRemoved((shared,))])
    assert index.resident_tokens("fg-s2", SALT) == 0
    index.apply([BlockStored((b"z" * 32,), shared, 4, None, "fg-s3")])  # its link is gone
    assert index.resident_tokens("fg-s3", SALT) == 0


def test_session_keys_are_opaque_and_apart_across_tenants():
    assert session_key("a", "bc") != session_key("ab", "c")
    key = session_key("tenant", "session")
    assert key == session_key("tenant", "session") and len(key) == 35
    assert key.startswith("fg-") and "session" not in key


def test_the_endpoint_is_the_replicas_port_plus_the_offset():
    assert events_endpoint("http://10.0.0.5:8000", 1000) == "tcp://10.0.0.5:9000"
    assert events_endpoint("http://[::1]:8000", 7) == "tcp://[::1]:8007"


async def test_the_subscriber_follows_a_replicas_publisher():
    """A PUB socket sending vLLM's multipart (topic, sequence, payload) on the replica's
    port + offset; the subscriber's index follows it."""
    context = zmq.asyncio.Context()
    pub = context.socket(zmq.PUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    subscriber = KvEventSubscriber(port_offset=port - 8000)
    try:
        index = subscriber.index("http://127.0.0.1:8000")
        for _ in range(200):  # a late subscriber misses what was sent before it joined
            await pub.send_multipart((b"kv", (0).to_bytes(8, "big"), PAYLOADS[0]))
            if index.resident_tokens("fg-s1", SALT):
                break
            await asyncio.sleep(0.01)
        assert index.resident_tokens("fg-s1", SALT) == 12
        await pub.send_multipart((b"kv", (1).to_bytes(8, "big"), PAYLOADS[1]))
        for _ in range(200):
            if index.resident_tokens("fg-s1", SALT) == 8:
                break
            await asyncio.sleep(0.01)
        assert index.resident_tokens("fg-s1", SALT) == 8
    finally:
        await subscriber.close()
        pub.close(0)
        context.term()
