"""The LRU behind the per-session caches (``gateway.lru``), and the renderer caches' bound."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from gateway import metrics
from gateway.config import GatewayConfig
from gateway.dialects.openai_chat import OPENAI_CHAT as OPENAI
from gateway.lru import LRU
from gateway.pipeline import Pipeline
from gateway.resent_body import ResentBodies
from gateway.steps.render import CACHE_ENTRY_BYTES
from gateway.upstream import UpstreamClient
from router import ReplicaPool, make_policy
from store import open_store
from tests.gateway.conftest import ingest


def evictions(cache: str) -> float:
    return metrics.CACHE_EVICTIONS.labels(cache=cache)._value.get()


def test_least_recently_used_go_until_the_bytes_fit() -> None:
    before = evictions("test")
    lru: LRU[str] = LRU(100, **metrics.cache_callbacks("test"))
    lru.put("a", "A", 40)
    lru.put("b", "B", 40)
    assert lru.get("a") == "A"  # now the most recent
    lru.put("c", "C", 40)
    assert (lru.get("b"), lru.get("a"), lru.get("c")) == (None, "A", "C")
    assert lru.size == 80 and evictions("test") == before + 1
    lru.put("a", "A2", 90)  # replacing an entry counts its new size only
    assert (lru.get("a"), lru.get("c"), lru.size) == ("A2", None, 90)
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


async def test_renderer_caches_are_bounded_by_the_memory_they_keep(tmp_path: Path) -> None:
    # Room for one session's ReFold cache (~9 KB of text, charged ~6x), not two.
    config = GatewayConfig(store_url=f"sqlite:///{tmp_path}/s.db", render_cache_bytes=80_000)
    store = open_store(config.store_url)
    pool, policy = ReplicaPool(("http://127.0.0.1:9",)), make_policy("round_robin")
    pipeline = Pipeline(config, store, pool, policy, UpstreamClient())
    before = evictions("render")
    try:
        for session in ("a", "b"):
            headers = {"x-session-id": session}
            body = chat(session)
            ingested = await ingest(pipeline, OPENAI, body, headers)
            rendering = pipeline.rendered(ingested)
            # The upstream body, as the request path builds it (the decode cache's memo keeps
            # its messages' JSON).
            pipeline.forward.body(ingested, rendering.transcript)
            # As once an upstream accepted it: the history stored, the renderer cache kept.
            await pipeline.store_history(ingested, rendering, None)
        assert evictions("render") == before + 1
        assert 40_000 < pipeline.render._sessions.size <= 80_000
    finally:
        await store.close()


def agent_session(tag: str, steps: int) -> list[dict]:
    """An agent's history: a task, then tool calls each followed by a distinct ~4 KB output
    (source lines, as ``cat -n`` prints them)."""
    messages = [
        {"role": "system", "content": "a coding agent"},
        {"role": "user", "content": f"{tag}: make the failing test pass"},
    ]
    for step in range(steps):
        call = {"id": f"c{step}", "type": "function"}
        call["function"] = {"name": "bash", "arguments": f'{{"cmd": "cat -n mod{step}.py"}}'}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        source = "\n".join(
            f"{i:6d}\tdef {tag}_f{step}_{i}(x):  return x * {i} + {step}" for i in range(80)
        )
        messages.append({"role": "tool", "tool_call_id": f"c{step}", "content": source})
    return messages


def short_messages(tag: str, steps: int) -> list[dict]:
    """An agent's history of many tool calls answered by one-line outputs."""
    messages = [
        {"role": "system", "content": "a coding agent"},
        {"role": "user", "content": f"{tag}: list what changed"},
    ]
    for step in range(steps * 16):
        call = {"id": f"c{step}", "type": "function"}
        call["function"] = {"name": "bash", "arguments": f'{{"cmd": "stat f{step}"}}'}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{step}", "content": f"{tag} f{step}"})
    return messages


async def memory_held(
    cache: str,
    strategy: str,
    tmp_path: Path,
    history: Callable[[str, int], list[dict]] = agent_session,
) -> tuple[int, int, int]:
    """With only ``cache`` ("decode", "render" or "digest") on: (bytes it charged, bytes its
    entries keep alive: what tracemalloc sees freed when they are dropped, entries) after 4
    sessions of 2 requests each (``history(tag, steps)``)."""
    unbounded = 1 << 40
    config = GatewayConfig(
        store_url=f"sqlite:///{tmp_path}/{cache}-{strategy}.db",
        strategy=strategy,
        budget=4_000 if "cliff" in strategy else None,
        decode_cache_bytes=unbounded if cache == "decode" else 0,
        render_cache_bytes=unbounded if cache == "render" else 0,
        digest_cache_bytes=unbounded if cache == "digest" else 0,
    )
    store = open_store(config.store_url)
    pool, policy = ReplicaPool(("http://127.0.0.1:9",)), make_policy("round_robin")
    pipeline = Pipeline(config, store, pool, policy, UpstreamClient())
    lru = {
        "decode": pipeline.decoder.cache._sessions,
        "render": pipeline.render._sessions,
        "digest": store.digest_cache._seen,
    }[cache]

    async def session(tag: str) -> None:
        for steps in (6, 12):
            headers = {"x-session-id": tag}
            body = {"model": "m", "messages": history(tag, steps)}
            ingested = await ingest(pipeline, OPENAI, body, headers)
            rendering = pipeline.rendered(ingested)
            # The upstream body, as the request path builds it (the decode cache's memo keeps
            # its messages' JSON).
            pipeline.forward.body(ingested, rendering.transcript)
            # As once an upstream accepted it: the history stored, the renderer cache kept.
            await pipeline.store_history(ingested, rendering, None)

    try:
        await session("warm")  # imports, renderers, first-use allocations
        tracemalloc.start()
        try:
            for tag in ("a", "b", "c", "d"):
                await session(tag)
            gc.collect()
            held = tracemalloc.get_traced_memory()[0]
            charged, entries = lru.size, len(lru)
            lru._entries.clear()
            gc.collect()
            freed = held - tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
    finally:
        await store.close()
    return charged, freed, entries


@pytest.mark.parametrize(
    ("cache", "strategy"),
    [("decode", "refold"), ("render", "refold"), ("render", "cliff"), ("render", "refold+cliff")],
)
async def test_caches_charge_the_memory_their_entries_keep_alive(
    cache: str, strategy: str, tmp_path: Path
) -> None:
    """The byte bounds mean memory: what a cache charges for its entries is within a margin
    of what they keep alive (measured here; the renderers' factors are set from this)."""
    charged, freed, _ = await memory_held(cache, strategy, tmp_path)
    assert 0.75 <= charged / freed <= 1.5, (charged, freed)


@pytest.mark.parametrize(("cache", "strategy"), [("render", "refold"), ("digest", "base")])
async def test_many_short_messages_are_charged_what_they_keep_alive(
    cache: str, strategy: str, tmp_path: Path
) -> None:
    """Each message's objects cost memory however short its text: the charge counts them."""
    charged, freed, _ = await memory_held(cache, strategy, tmp_path, short_messages)
    assert 0.75 <= charged / freed <= 1.5, (charged, freed)


async def test_a_strategy_without_a_cache_charges_only_its_entry(tmp_path: Path) -> None:
    charged, freed, entries = await memory_held("render", "base", tmp_path)
    assert charged == entries * CACHE_ENTRY_BYTES and freed < charged


@pytest.mark.parametrize("history", [short_messages, agent_session])
def test_resent_bodies_charge_what_their_objects_keep_alive(
    history: Callable[[str, int], list[dict]],
) -> None:
    """The parsed prefixes a session's next body reuses (``ResentBodies``) are charged as
    if nothing else held them: the decode cache drops the same raw messages at other
    times, and what is left must still be counted (many short messages cost several times
    their text)."""
    bodies = ResentBodies(1 << 40, 100_000)
    raw = [orjson.dumps({"model": "m", "messages": history(tag, 12)}) for tag in "abcd"]
    bodies.parse(orjson.dumps({"model": "m", "messages": history("warm", 12)}), "w", "messages")
    gc.collect()
    tracemalloc.start()
    try:
        for tag, body in zip("abcd", raw, strict=True):
            bodies.parse(body, tag, "messages")
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
        charged = bodies._slots.size - bodies._slots.peek("w")[0].charge
        for tag in "abcd":
            bodies._slots.pop(tag)
        gc.collect()
        freed = held - tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert 1.0 <= charged / freed <= 1.5, (charged, freed)
