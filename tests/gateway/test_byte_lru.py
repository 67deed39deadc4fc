"""The byte-bounded LRU behind the per-session caches, and the renderer caches' bound."""

from __future__ import annotations

from pathlib import Path

from gateway import metrics
from gateway.byte_lru import ByteLRU
from gateway.config import GatewayConfig
from gateway.dialects.openai_chat import OPENAI_CHAT as OPENAI
from gateway.pipeline import Pipeline
from gateway.steps.ingest import commit
from gateway.upstream import UpstreamClient
from router import ReplicaPool, make_policy
from store import open_store


def evictions(cache: str) -> float:
    return metrics.CACHE_EVICTIONS.labels(cache=cache)._value.get()


def test_least_recently_used_go_until_the_bytes_fit() -> None:
    before = evictions("test")
    lru: ByteLRU[str] = ByteLRU("test", max_bytes=100)
    lru.put("a", "A", 40)
    lru.put("b", "B", 40)
    assert lru.get("a") == "A"  # now the most recent
    lru.put("c", "C", 40)
    assert (lru.get("b"), lru.get("a"), lru.get("c")) == (None, "A", "C")
    assert lru.bytes == 80 and evictions("test") == before + 1
    lru.put("a", "A2", 90)  # replacing an entry counts its new size only
    assert (lru.get("a"), lru.get("c"), lru.bytes) == ("A2", None, 90)
    lru.put("huge", "H", 101)  # larger than the bound: not kept, nothing else lost
    assert (lru.get("huge"), lru.get("a"), len(lru)) == (None, "A2", 1)
    assert metrics.CACHE_BYTES.labels(cache="test")._value.get() == 90


def chat(session: str) -> dict:
    messages = [{"role": "system", "content": "agent"}, {"role": "user", "content": "fix it"}]
    for step in range(4):
        call = {
            "id": f"c{step}",
            "type": "function",
            "function": {"name": "bash", "arguments": "{}"},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        text = f"{session} output {step} " * 200
        messages.append({"role": "tool", "tool_call_id": f"c{step}", "content": text})
    return {"model": "m", "messages": messages}


async def test_renderer_caches_are_bounded_by_the_text_they_hold(tmp_path: Path) -> None:
    # Room for one session's rendering, not two.
    config = GatewayConfig(store_url=f"sqlite:///{tmp_path}/s.db", render_cache_bytes=12_000)
    store = open_store(config.store_url)
    pool, policy = ReplicaPool(("http://127.0.0.1:9",)), make_policy("round_robin")
    pipeline = Pipeline(config, store, pool, policy, UpstreamClient())
    before = evictions("render")
    try:
        for session in ("a", "b"):
            headers = {"x-session-id": session}
            body = chat(session)
            prepared = await pipeline.prepare(
                await pipeline.decode(OPENAI, body, headers), body, headers
            )
            pipeline.render(prepared)
            await commit(store, prepared, None)  # as once an upstream accepted it
            pipeline.render.keep(prepared)
        assert evictions("render") == before + 1
        assert 0 < pipeline.render._sessions.bytes <= 12_000
    finally:
        await store.close()
