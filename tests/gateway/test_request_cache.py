"""Incremental decoding gives exactly the full decode, and reuses what did not change."""

from __future__ import annotations

import copy
import gc
import tracemalloc
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway import metrics
from gateway.config import GatewayConfig
from gateway.dialects import anthropic_messages, openai_chat
from gateway.dialects.anthropic_messages import ANTHROPIC_MESSAGES as ANTHROPIC
from gateway.dialects.errors import DialectError
from gateway.dialects.openai_chat import OPENAI_CHAT as OPENAI
from gateway.dialects.openai_responses import OPENAI_RESPONSES
from gateway.dialects.volatile import without_volatile
from gateway.fold.renderer import estimate_tokens
from gateway.identity import identify
from gateway.pipeline import Pipeline
from gateway.request_cache import (
    DecodeCache,
    Decoded,
    MessageMemo,
    entry_bytes,
    session_ids,
)
from gateway.tenants import hash_key
from gateway.transcript import Message, Text, ToolCall, Transcript, text_message
from gateway.upstream import UpstreamClient
from router import ReplicaPool, make_policy
from store import open_store
from store.branches import MICROCOMPACTED, is_microcompacted
from tests.dialects.strategies import anthropic_bodies, openai_bodies, responses_bodies
from tests.gateway.conftest import ingest

# The tenant every decode here belongs to (the cache keys by tenant).
TENANT = "t"

FULL = {
    "openai": openai_chat.decode_request,
    "anthropic": anthropic_messages.decode_request,
    "responses": OPENAI_RESPONSES.decode,
}


def outcome(decode: Any, body: dict[str, Any]) -> Any:
    """A transcript, or the error's (message, param): what a decoder made of ``body``."""
    try:
        return decode(body)
    except DialectError as exc:
        return (str(exc), exc.param)


def full_decode(name: str, body: dict[str, Any]) -> Any:
    """The full decode, markers dropped, with each message's store dict and the tokens."""
    t = outcome(FULL[name], body)
    if isinstance(t, Transcript):
        t = t.with_messages(without_volatile(m) for m in t.messages)
        stored = [m.to_dict() for m in t.messages]
        placeholders = sum(map(is_microcompacted, stored))
        return t, stored, sum(estimate_tokens(m) for m in t.messages), placeholders
    return t


def cached_decode(cache: DecodeCache, dialect: Any, body: dict[str, Any]) -> Any:
    decoded = cache.decode(dialect, body, tenant=TENANT)
    return decoded.transcript, decoded.stored, decoded.tokens, decoded.placeholders


def toggle_cache_control(value: Any, flip: list[bool]) -> Any:
    """``value`` with ``cache_control`` moved: dropped where it was, added on some blocks."""
    if isinstance(value, list):
        return [toggle_cache_control(v, flip) for v in value]
    if not isinstance(value, dict):
        return value
    out = {k: toggle_cache_control(v, flip) for k, v in value.items() if k != "cache_control"}
    if value.get("type") == "text" and "cache_control" not in value and flip and flip.pop():
        out["cache_control"] = {"type": "ephemeral"}
    return out


@st.composite
def request_sequences(
    draw: st.DrawFn, bodies: st.SearchStrategy, key: str = "messages"
) -> list[dict[str, Any]]:
    """A session's requests: the first body, then growing, cut, edited, diverging or
    re-marked versions of the one before (``key``: the body's conversation field)."""
    first = draw(bodies)
    sequence = [first]
    for _ in range(draw(st.integers(1, 4))):
        body = copy.deepcopy(sequence[-1])
        messages = body[key]
        other = draw(bodies)[key]
        edit = draw(st.sampled_from(["extend", "cut", "replace", "drop", "marks", "same"]))
        if edit == "extend":
            messages.extend(other)
        elif edit == "cut":
            del messages[draw(st.integers(1, len(messages))) :]
        elif edit == "replace":
            messages[draw(st.integers(0, len(messages) - 1))] = other[0]
        elif edit == "drop" and len(messages) > 1:
            del messages[draw(st.integers(0, len(messages) - 1))]
        elif edit == "marks":
            flips = draw(st.lists(st.booleans(), max_size=8))
            body[key] = toggle_cache_control(messages, flips)
        sequence.append(body)
    return sequence


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize(
    ("endpoint", "bodies", "key"),
    [
        (OPENAI, openai_bodies(), "messages"),
        (ANTHROPIC, anthropic_bodies(), "messages"),
        (OPENAI_RESPONSES, responses_bodies(), "input"),
    ],
    ids=["openai", "anthropic", "responses"],
)
def test_incremental_decode_is_the_full_decode(endpoint: Any, bodies: Any, key: str) -> None:
    @SETTINGS
    @given(request_sequences(bodies, key))
    def check(sequence: list[dict[str, Any]]) -> None:
        cache = DecodeCache()
        for body in sequence:
            expected = full_decode(endpoint.name, body)
            got = outcome(lambda b: cached_decode(cache, endpoint, b), copy.deepcopy(body))
            assert got == expected

    check()


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["step", "cleared step", "clear", "put back", "cut"]), st.data()),
        min_size=1,
        max_size=12,
    )
)
def test_microcompaction_placeholders_are_counted_as_the_full_decode_counts(edits) -> None:
    """A session whose harness clears old results, puts them back, forks and grows: the
    placeholders counted as messages are decoded (``Decoded.placeholders``) are the ones a
    whole pass over the history finds."""
    cache, messages = DecodeCache(), list(HISTORY)
    for edit, data in edits:
        results = [i for i, m in enumerate(messages) if m["role"] == "tool"]
        n = len(messages)
        if edit in ("step", "cleared step"):
            messages += [
                call(f"c{n}"),
                result(f"c{n}", MICROCOMPACTED if "cleared" in edit else "x"),
            ]
        elif edit in ("clear", "put back") and results:
            i = data.draw(st.sampled_from(results))
            text = MICROCOMPACTED if edit == "clear" else "x"
            messages[i] = {**messages[i], "content": text}
        elif edit == "cut":
            del messages[data.draw(st.integers(2, n)) :]
        body = chat(copy.deepcopy(messages))
        assert cached_decode(cache, OPENAI, body) == full_decode("openai", body)


def chat(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": messages, **extra}


def call(call_id: str) -> dict[str, Any]:
    function = {"name": "bash", "arguments": "{}"}
    return {"role": "assistant", "tool_calls": [{"id": call_id, "function": function}]}


def result(call_id: str, text: str = "out") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


HISTORY = [
    {"role": "system", "content": "sys"},
    {"role": "user", "content": "task"},
    call("c1"),
    result("c1"),
]


def test_the_unchanged_prefix_reuses_the_decoded_messages() -> None:
    cache = DecodeCache()
    first = cache.decode(OPENAI, chat(copy.deepcopy(HISTORY)), tenant=TENANT).transcript
    grown = chat([*copy.deepcopy(HISTORY), call("c2"), result("c2")])
    second = cache.decode(OPENAI, grown, tenant=TENANT).transcript
    assert all(a is b for a, b in zip(first.messages, second.messages[:4], strict=True))
    assert second.messages[5].tool_call_id == "c2"


def test_moving_cache_control_keeps_the_decoded_objects() -> None:
    """Claude Code marks its newest blocks: the marked messages still reuse their decode."""

    def body(marked: int) -> dict[str, Any]:
        def block(text: str, i: int) -> dict[str, Any]:
            mark = {"cache_control": {"type": "ephemeral"}} if i == marked else {}
            return {"type": "text", "text": text, **mark}

        turns = [{"role": "user", "content": [block(f"turn {i}", i)]} for i in range(1, 4)]
        return {"model": "m", "max_tokens": 8, "system": [block("sys", 0)], "messages": turns}

    cache = DecodeCache()
    first = cache.decode(ANTHROPIC, body(0), tenant=TENANT)
    second = cache.decode(ANTHROPIC, body(2), tenant=TENANT)
    assert second.transcript == full_decode("anthropic", body(2))[0]
    assert second.transcript.messages[0] is first.transcript.messages[0]  # the system prompt
    assert second.transcript.messages[1] is first.transcript.messages[1]
    assert second.transcript.messages[2] is not first.transcript.messages[2]
    assert second.stored[1] is first.stored[1]


def test_an_edited_message_is_decoded_again_from_there() -> None:
    cache = DecodeCache()
    first = cache.decode(OPENAI, chat(copy.deepcopy(HISTORY)), tenant=TENANT).transcript
    edited = copy.deepcopy(HISTORY)
    edited[2]["tool_calls"][0]["function"]["arguments"] = '{"x": 1}'
    second = cache.decode(OPENAI, chat(edited), tenant=TENANT).transcript
    assert second.messages[1] is first.messages[1]
    assert second.messages[2].tool_calls[0].arguments == '{"x": 1}'
    assert second.messages[3] is not first.messages[3]


def test_a_result_must_answer_a_call_issued_in_the_reused_prefix() -> None:
    cache = DecodeCache()
    cache.decode(OPENAI, chat(copy.deepcopy(HISTORY)), tenant=TENANT)
    with pytest.raises(DialectError, match="'c9' does not answer") as err:
        cache.decode(OPENAI, chat([*copy.deepcopy(HISTORY), result("c9")]), tenant=TENANT)
    assert err.value.param == "messages[4].tool_call_id"
    # A cut history forgets the calls it no longer holds.
    with pytest.raises(DialectError, match="'c1' does not answer"):
        cache.decode(OPENAI, chat([*copy.deepcopy(HISTORY[:2]), result("c1")]), tenant=TENANT)


def test_the_body_checks_run_on_every_request() -> None:
    cache = DecodeCache()
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    cache.decode(ANTHROPIC, copy.deepcopy(body), tenant=TENANT)
    del body["max_tokens"]
    with pytest.raises(DialectError, match="max_tokens"):
        cache.decode(ANTHROPIC, body, tenant=TENANT)


def test_sessions_are_kept_apart_and_the_cache_is_bounded_by_bytes() -> None:
    one = DecodeCache().decode(OPENAI, chat(copy.deepcopy(HISTORY)), ["x"], tenant=TENANT)
    evictions = metrics.CACHE_EVICTIONS.labels(cache="decode")
    before = evictions._value.get()
    # room for one session's text, not two
    calls = sum(len(m.tool_calls) for m in one.transcript.messages)
    cache = DecodeCache(
        max_bytes=entry_bytes(len(one.transcript.messages), calls, one.tokens) * 3 // 2
    )
    a = cache.decode(OPENAI, chat(copy.deepcopy(HISTORY)), ["a"], tenant=TENANT).transcript
    b = cache.decode(OPENAI, chat(copy.deepcopy(HISTORY)), ["b"], tenant=TENANT).transcript
    assert b.messages[0] is not a.messages[0]
    again = cache.decode(OPENAI, chat(copy.deepcopy(HISTORY)), ["a"], tenant=TENANT).transcript
    assert again.messages[0] is not a.messages[0]  # "a" was evicted by "b"
    assert again == a
    assert evictions._value.get() == before + 2  # "a" for "b", "b" for "a" again
    # a session larger than the whole bound is decoded, not kept
    tiny = DecodeCache(max_bytes=8)
    first = tiny.decode(OPENAI, chat(copy.deepcopy(HISTORY)), ["a"], tenant=TENANT).transcript
    assert (
        tiny.decode(OPENAI, chat(copy.deepcopy(HISTORY)), ["a"], tenant=TENANT).transcript == first
    )


def test_session_ids_name_what_the_request_says() -> None:
    body = {"prompt_cache_key": "k", "metadata": {"session_id": "m"}, "user": "u"}
    ids = session_ids({"x-session-id": "s1"}, body, "x-session-id")
    assert ids[0] == "s1" and "'k'" in ids and any("'m'" in i for i in ids[1:])
    # OpenAI's ``user`` names an end user, not a session: it is not part of the key.
    assert not any("'u'" in i for i in ids[1:])


def test_memo_gives_what_the_functions_give() -> None:
    memo = MessageMemo()
    messages = [
        text_message("user", "hello there"),
        Message("assistant", (Text("ok"), ToolCall("c1", "bash", '{"cmd": "ls"}'))),
    ]
    assert memo.tokens(messages) == sum(estimate_tokens(m) for m in messages)
    assert [memo.encode(m) for m in messages] == openai_chat.encode_messages(messages)
    assert memo.encode(messages[0]) is memo.encode(messages[0])


def test_memo_forgets_messages_a_request_did_not_use() -> None:
    memo = MessageMemo()
    kept, dropped = text_message("user", "kept"), text_message("user", "dropped")
    first = [memo.encode(kept), memo.encode(dropped)]
    memo.next_request()
    assert memo.encode(kept) is first[0]
    memo.next_request()
    memo.next_request()
    assert memo.encode(dropped) is not first[1]
    assert memo.encode(kept) is not first[0]


def test_memo_sums_and_encodes_renderings_that_grow_change_and_shrink_exactly() -> None:
    memo = MessageMemo()
    history = [text_message("user", "task"), text_message("assistant", "ünïcode \u2028 ok")]
    for step in range(4):
        history.append(Message("assistant", (ToolCall(f"c{step}", "bash", '{"cmd": "ls"}'),)))
        history.append(Message("tool", (Text(f"out {step}"),), tool_call_id=f"c{step}"))
    renderings = [
        history[:2],
        history[:4],  # grows: only the new messages are encoded
        [*history[:4]],  # the same messages in a new list
        history[:6],
        [history[0], text_message("assistant", "rewritten"), *history[2:6]],  # changed
        [text_message("user", "task"), *history[1:3]],  # equal objects, shorter
        [],
        history,
    ]
    for messages in renderings:
        assert memo.tokens(messages) == sum(estimate_tokens(m) for m in messages)
        assert memo.messages_json(messages) == orjson.dumps(openai_chat.encode_messages(messages))


def grown_bodies(steps: int) -> list[dict[str, Any]]:
    """A harness's requests: each re-sends the history so far with one more step."""
    history = [{"role": "system", "content": "agent"}, {"role": "user", "content": "fix it"}]
    bodies = []
    for step in range(steps):
        history = [*history, call(f"c{step}"), result(f"c{step}", f"output {step} " * 40)]
        tools = [{"type": "function", "function": {"name": "bash", "parameters": {}}}]
        bodies.append(chat(copy.deepcopy(history), tools=tools, stream=True))
    bodies.append(chat(copy.deepcopy(history[:4]), tools=tools))  # a shorter re-send
    return bodies


async def test_the_pipeline_sends_upstream_what_the_full_path_sends(tmp_path: Path) -> None:
    """Same upstream bodies, token estimates and branches as decoding every request anew."""
    config = GatewayConfig(store_url=f"sqlite:///{tmp_path}/a.db", k=2)
    cached = Pipeline(config, open_store(config.store_url), *_offline(config))
    fresh_config = replace(config, store_url=f"sqlite:///{tmp_path}/b.db")
    fresh = Pipeline(fresh_config, open_store(fresh_config.store_url), *_offline(fresh_config))
    headers = {"x-session-id": "s"}
    try:
        for body in grown_bodies(8):
            got = await ingest(cached, OPENAI, copy.deepcopy(body), headers)
            whole = Decoded.full(OPENAI.decode(copy.deepcopy(body)))  # the oracle
            want = await ingest(fresh, OPENAI, body, headers, decoded=whole)
            assert (got.found, got.raw_tokens) == (want.found, want.raw_tokens)
            got_rendering = cached.rendered(got)
            want_rendering = fresh.rendered(want)
            assert got_rendering.tokens == want_rendering.tokens
            # The bytes the upstream gets (the messages are an orjson.Fragment).
            assert orjson.dumps(cached.forward.body(got, got_rendering.transcript)) == orjson.dumps(
                fresh.forward.body(want, want_rendering.transcript)
            )
    finally:
        await cached.store.close()
        await fresh.store.close()


def _offline(config: GatewayConfig) -> tuple[Any, ...]:
    """Pool, policy and upstream client that nothing here uses: no request leaves."""
    return ReplicaPool(("http://127.0.0.1:9",)), make_policy("round_robin"), UpstreamClient()


def test_one_tenants_session_is_never_a_hit_for_another() -> None:
    """A hit is faster than a miss: a cache shared across tenants would tell one tenant
    whether another sent a body under a session id. A hit reuses the decoded objects."""
    cache = DecodeCache()
    body = chat(copy.deepcopy(HISTORY))
    acme = cache.decode(OPENAI, copy.deepcopy(body), ["s"], tenant="acme").transcript
    beta = cache.decode(OPENAI, copy.deepcopy(body), ["s"], tenant="beta").transcript
    assert beta == acme
    assert not any(b is a for b, a in zip(beta.messages, acme.messages, strict=True))
    assert len(cache) == 2  # one entry per tenant, neither replaced the other
    again = cache.decode(OPENAI, copy.deepcopy(body), ["s"], tenant="acme").transcript
    assert all(g is a for g, a in zip(again.messages, acme.messages, strict=True))


async def test_the_pipeline_keys_decoding_by_the_callers_tenant(tmp_path: Path) -> None:
    keys = {hash_key("key-acme"): "acme", hash_key("key-beta"): "beta"}
    config = GatewayConfig(store_url=f"sqlite:///{tmp_path}/a.db", api_keys=keys)
    pipeline = Pipeline(config, open_store(config.store_url), *_offline(config))
    body = chat(copy.deepcopy(HISTORY))
    try:
        decoded = {}
        for tenant in ("acme", "beta"):
            headers = {"x-session-id": "s", "x-api-key": f"key-{tenant}"}
            caller = identify(headers, config, pipeline.tenants, pipeline.render.spec)
            assert caller.tenant == tenant
            decoded[tenant] = await pipeline.decode(OPENAI, copy.deepcopy(body), headers, tenant)
        first, second = decoded["acme"].transcript.messages, decoded["beta"].transcript.messages
        assert not any(b is a for b, a in zip(second, first, strict=True))
        assert len(pipeline.decoder.cache) == 2
    finally:
        await pipeline.store.close()


def tool_outputs(tag: str, steps: int) -> list[dict[str, Any]]:
    """An agent's history of tool calls, each answered by a distinct ~16 KB output."""
    history = [{"role": "system", "content": "agent"}, {"role": "user", "content": f"{tag} go"}]
    for step in range(steps):
        source = "\n".join(f"{i:6d}\tdef {tag}_f{step}_{i}(x): return x * {i}" for i in range(400))
        history += [call(f"c{step}"), result(f"c{step}", source)]
    return history


def short_chat(tag: str, steps: int) -> list[dict[str, Any]]:
    """A chat of many one-line messages."""
    history = [{"role": "system", "content": "agent"}, {"role": "user", "content": f"{tag} hi"}]
    for step in range(steps):
        history.append({"role": "assistant", "content": f"{tag} step {step}: done, next?"})
        history.append({"role": "user", "content": f"{tag} ok {step}"})
    return history


def short_tool_calls(tag: str, steps: int) -> list[dict[str, Any]]:
    """An agent's history of many tool calls with one-line outputs."""
    history = [{"role": "system", "content": "agent"}, {"role": "user", "content": f"{tag} go"}]
    for step in range(steps):
        history += [call(f"c{step}"), result(f"c{step}", f"{tag} file{step}.py")]
    return history


@pytest.mark.parametrize(
    ("shape", "steps"), [(tool_outputs, 8), (short_chat, 150), (short_tool_calls, 150)]
)
async def test_the_charge_is_the_memory_an_entry_keeps_alive(
    shape: Callable[[str, int], list[dict[str, Any]]], steps: int, tmp_path: Path
) -> None:
    """The decode cache's byte bound means memory for long and for many short messages: what
    it charges, with the store's digest cache that shares its store dicts, is within a
    margin of what their entries keep alive (what tracemalloc sees freed when they are
    dropped), the memo's upstream JSON included."""
    config = GatewayConfig(store_url=f"sqlite:///{tmp_path}/s.db", render_cache_bytes=0)
    pipeline = Pipeline(config, open_store(config.store_url), *_offline(config))
    lru = pipeline.decoder.cache._sessions

    async def session(tag: str) -> None:
        for length in (steps // 2, steps):
            body = chat(shape(tag, length))
            ingested = await ingest(pipeline, OPENAI, body, {"x-session-id": tag})
            rendering = pipeline.rendered(ingested)
            pipeline.forward.body(ingested, rendering.transcript)
            await pipeline.store_history(ingested, rendering, None)

    try:
        await session("warm")  # imports and first-use allocations
        tracemalloc.start()
        try:
            for tag in ("a", "b", "c"):
                await session(tag)
            gc.collect()
            held = tracemalloc.get_traced_memory()[0]
            # The store's digest cache keeps the same store dicts (``shared``): the two
            # caches' entries of these sessions, dropped together, free what both charge.
            digests = pipeline.store.digest_cache
            charged = lru.size + digests.bytes
            lru.clear()
            for tag in ("a", "b", "c"):
                digests.forget(config.default_tenant, tag)
            charged -= digests.bytes  # the warm-up session's, allocated before tracing
            gc.collect()
            freed = held - tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
    finally:
        await pipeline.store.close()
    assert 0.75 <= charged / freed <= 1.5, (charged, freed)


@pytest.mark.parametrize(
    ("before", "after"), [(0.0, 0), (1, True), ({"a": 1, "b": 2}, {"b": 2, "a": 1})]
)
def test_a_resent_item_equal_only_by_python_equality_is_decoded_again(before, after) -> None:
    """``0 == 0.0``, ``1 == True`` and dicts in another key order compare equal in Python,
    yet a tool call's arguments carry each differently: the re-sent item is decoded anew,
    never taken from the previous body (the fuzz suite's full-path check found it)."""

    def body(value: Any) -> dict[str, Any]:
        use = {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"v": value}}
        return {
            "model": "m",
            "max_tokens": 8,
            "messages": [
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": [use]},
            ],
        }

    cache = DecodeCache()
    cache.decode(ANTHROPIC, body(before), tenant=TENANT)
    again = cache.decode(ANTHROPIC, body(after), tenant=TENANT)
    assert again.transcript == ANTHROPIC.decode(body(after))
    assert again.stored == [m.to_dict() for m in ANTHROPIC.decode(body(after)).messages]
