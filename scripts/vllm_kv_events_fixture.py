"""Writes tests/router/data/vllm_kv_events.json: KV event batches encoded as vLLM's ZMQ
publisher encodes them (msgspec msgpack of its own ``KVEventBatch`` classes), with block
hashes from vLLM's own hasher (sha256 over pickle, ``NONE_HASH`` from its fixed seed) and
a tenant's ``cache_salt`` on the first block. Run by the vLLM venv:

    .vllm-venv/bin/python scripts/vllm_kv_events_fixture.py > tests/router/data/vllm_kv_events.json
"""

import json
import sys

import msgspec
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from vllm.utils.hashing import sha256
from vllm.v1.core import kv_cache_utils

SALT = "a" * 64
BLOCK = 4
TOKENS = list(range(100, 112))  # three full blocks


def main() -> None:
    kv_cache_utils.init_none_hash(sha256)
    hashes, keys, parent = [], [], None
    for i in range(3):
        extra = (("cache_salt", SALT),) if i == 0 else None
        block = TOKENS[i * BLOCK : (i + 1) * BLOCK]
        parent = kv_cache_utils.hash_block_tokens(sha256, parent, block, extra)
        hashes.append(parent)
        keys.append(extra)

    def stored(first: int, last: int) -> BlockStored:
        return BlockStored(
            block_hashes=hashes[first:last],
            parent_block_hash=hashes[first - 1] if first else None,
            token_ids=TOKENS[first * BLOCK : last * BLOCK],
            block_size=BLOCK,
            lora_id=None,
            medium="GPU",
            lora_name=None,
            extra_keys=kv_cache_utils.to_event_extra_keys(keys[first:last]),
            group_idx=0,
            session_id="fg-s1",
        )

    batches = [
        KVEventBatch(ts=1.5, events=[stored(0, 2), stored(2, 3)]),
        KVEventBatch(ts=2.5, events=[BlockRemoved(block_hashes=[hashes[2]], medium="GPU")]),
        KVEventBatch(ts=3.5, events=[AllBlocksCleared()]),
    ]
    encoder = msgspec.msgpack.Encoder()
    out = {
        "_": "written by scripts/vllm_kv_events_fixture.py with vLLM 0.32.0",
        "salt": SALT,
        "block_size": BLOCK,
        "tokens": TOKENS,
        "hashes": [h.hex() for h in hashes],
        "payloads": [encoder.encode(b).hex() for b in batches],
    }
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
