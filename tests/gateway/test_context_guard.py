"""The context guard: thresholds below the replicas' window, and a session driven past it
through the real gateway to the fake upstream (which refuses prompts over its window as
vLLM does)."""

from __future__ import annotations

import gc
import json
import tracemalloc
from dataclasses import replace
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from gateway import context_guard
from gateway.config import GatewayConfig
from gateway.context_guard import (
    DEFAULT_REPLY_TOKENS,
    MARGIN,
    PRIOR_RATIO,
    ContextGuard,
    reply_room,
    rounded_ratio,
    threshold,
    tools_estimate,
    window_of,
)
from gateway.fold.bound import Renderers, bounded
from gateway.fold.cliff import Cliff
from gateway.fold.compose import Composed
from gateway.transcript import Transcript, text_message
from gateway.upstream import UpstreamError
from loadtests.fake_upstream import FakeUpstream
from router.replica import Replica
from tests.gateway.conftest import running_gateway

WINDOW = 8_192
TOOLS = ({"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}},)


# -- the pure parts ---------------------------------------------------------------------


def test_reply_room_is_max_tokens_or_the_default_at_most_a_quarter() -> None:
    assert reply_room(WINDOW, 500) == 500
    assert reply_room(WINDOW, None) == min(DEFAULT_REPLY_TOKENS, WINDOW // 4)
    assert reply_room(WINDOW, 32_000) == WINDOW // 4  # vLLM clamps it; no use reserving it
    assert reply_room(WINDOW, True) == reply_room(WINDOW, None)
    assert reply_room(WINDOW, 0) == reply_room(WINDOW, None)


def test_threshold_leaves_the_reply_the_tools_and_the_margin() -> None:
    limit = threshold(WINDOW, 1_000, 1.25, 300)
    assert limit == int((WINDOW - 1_000) / (1.25 * (1 + MARGIN))) - 300
    # Sent at the threshold, the real prompt plus the reply stays inside the window.
    assert (limit + 300) * 1.25 + 1_000 <= WINDOW
    assert threshold(1_000, 900, 3.0, 5_000) == 1


def test_ratio_rounds_up_to_steps() -> None:
    assert rounded_ratio(1.0) == 1.0
    assert rounded_ratio(1.001) == 1.03125
    assert rounded_ratio(1.03125) == 1.03125


def test_window_of_reads_vllm_models() -> None:
    models = {
        "data": [
            {"id": "a", "max_model_len": 4096},
            {"id": "b", "max_model_len": 32768},
            {"id": "c"},
        ]
    }
    assert window_of(models, "b") == 32768
    assert window_of(models, None) == 4096  # the smallest: whichever the request names
    assert window_of(models, "c") == 4096
    assert window_of({"data": [{"id": "x"}]}, None) is None
    assert window_of({"error": "no"}, None) is None
    assert window_of({"data": [{"id": "x", "max_model_len": "4096"}]}, None) is None


def test_bounded_puts_one_cliff_outside() -> None:
    assert str(bounded("refold")) == "refold+cliff"
    assert str(bounded("base")) == "base+cliff"
    assert str(bounded("cliff")) == "cliff"
    assert str(bounded("refold+cliff")) == "refold+cliff"
    assert str(bounded("cliff+mask")) == "cliff+mask+cliff"


def test_tools_estimate_is_a_quarter_of_their_json() -> None:
    with_tools = Transcript((text_message("user", "hi"),), tools=TOOLS)
    assert tools_estimate(with_tools) == len(json.dumps(list(TOOLS))) // 4
    assert tools_estimate(Transcript((text_message("user", "hi"),))) == 0


# -- the guard's rules ------------------------------------------------------------------


def guard_over(windows: dict[str, Any], enabled: bool = True) -> tuple[ContextGuard, list[str]]:
    """A guard over replicas whose ``/v1/models`` answers are ``windows`` (an exception is
    raised as the fetch's failure); also returns the URLs fetched, in order."""
    fetched: list[str] = []
    replicas = [Replica(url, healthy=True) for url in windows]

    async def get_json(url: str) -> Any:
        fetched.append(url)
        answer = windows[url.removesuffix("/v1/models")]
        if isinstance(answer, BaseException):
            raise answer
        return {"data": [{"id": "m", "max_model_len": answer}]}

    return ContextGuard(lambda: replicas, get_json, Renderers(), enabled=enabled), fetched


def request(max_tokens: int | None = None, tools: tuple = ()) -> Transcript:
    params = {} if max_tokens is None else {"max_tokens": max_tokens}
    return Transcript((text_message("user", "task"),), tools=tools, params=params)


def cliff_of(renderer: Any) -> Cliff:
    return renderer.outer if isinstance(renderer, Composed) else renderer


async def test_the_smallest_window_and_failed_replicas_asked_again() -> None:
    guard, fetched = guard_over(
        {"http://a": 32_768, "http://b": UpstreamError("down", retryable=True)}
    )
    await guard.learn("m")
    assert guard.window() == 32_768
    await guard.learn("m")
    assert fetched == ["http://a/v1/models", "http://b/v1/models", "http://b/v1/models"]

    guard, _ = guard_over({"http://a": 32_768, "http://b": 4_096})
    await guard.learn("m")
    assert guard.window() == 4_096


async def test_no_window_or_a_configured_budget_leaves_the_strategy_alone() -> None:
    guard, fetched = guard_over({"http://a": 4_096}, enabled=False)
    await guard.learn("m")
    assert fetched == [] and guard.renderer(("acme", "s"), "refold", request()) is None
    guard, _ = guard_over({"http://a": 4_096})
    assert guard.renderer(("acme", "s"), "refold", request()) is None  # not learnt yet


async def test_threshold_follows_calibration_until_the_session_compacts() -> None:
    guard, _ = guard_over({"http://a": WINDOW})
    await guard.learn("m")
    first = guard.renderer(("acme", "s"), "refold", request(1_000))
    assert first is not None and first.name == "refold+cliff"
    assert cliff_of(first).threshold == threshold(WINDOW, 1_000, PRIOR_RATIO, 0)
    # The replica counted 1.2 tokens per estimated token: the threshold rises.
    guard.rendered(("acme", "s"), 2_000, compacted=False)
    guard.observe(("acme", "s"), {"prompt_tokens": 2_400})
    second = cliff_of(guard.renderer(("acme", "s"), "refold", request(1_000)))
    assert second.threshold == threshold(WINDOW, 1_000, rounded_ratio(1.2), 0)
    # A reading a little lower does not move it (each move replays the session's points).
    guard.observe(("acme", "s"), {"prompt_tokens": 2_350})
    assert cliff_of(guard.renderer(("acme", "s"), "refold", request(1_000))) is second
    # A new session starts from the largest recent ratio, not the prior.
    other = cliff_of(guard.renderer(("acme", "t"), "base", request(1_000)))
    assert other.threshold == second.threshold

    # Once compacted, a larger reply does not move it (vLLM clamps the reply)...
    guard.rendered(("acme", "s"), 5_000, compacted=True)
    guard.observe(("acme", "s"), {"prompt_tokens": 6_000})
    same = guard.renderer(("acme", "s"), "refold", request(2_000))
    assert cliff_of(same).threshold == second.threshold
    assert same is guard.renderer(
        ("acme", "s"), "refold", request(1_000)
    )  # the same renderer, cache
    # ... a lower ratio does not raise it, a higher one lowers it, and tools count.
    guard.observe(("acme", "s"), {"prompt_tokens": 5_000})
    assert (
        cliff_of(guard.renderer(("acme", "s"), "refold", request(1_000))).threshold
        == second.threshold
    )
    guard.observe(("acme", "s"), {"prompt_tokens": 7_000})
    lowered = cliff_of(guard.renderer(("acme", "s"), "refold", request(1_000))).threshold
    assert lowered == threshold(WINDOW, 1_000, rounded_ratio(1.4), 0)
    with_tools = cliff_of(guard.renderer(("acme", "s"), "refold", request(1_000, TOOLS))).threshold
    assert with_tools == lowered - tools_estimate(request(tools=TOOLS))


def large_tools(tag: str) -> tuple[dict[str, Any], ...]:
    """~60 KB of tool schemas of their own (a harness with many documented tools)."""
    return tuple(
        {
            "type": "function",
            "function": {"name": f"{tag}_tool{i}", "description": f"{tag} {i} " + "d" * 1_000},
        }
        for i in range(60)
    )


async def test_a_session_keeps_a_count_of_its_tools_not_their_schemas() -> None:
    guard, _ = guard_over({"http://a": WINDOW})
    await guard.learn("m")
    guard.renderer(("acme", "warm"), "refold", request(1_000, large_tools("warm")))
    tracemalloc.start()
    try:
        for index in range(100):
            transcript = request(1_000, large_tools(f"s{index}"))
            guard.renderer(("acme", f"s{index}"), "refold", transcript)
            guard.rendered(("acme", f"s{index}"), 100, compacted=False)
            del transcript  # the request is over: only what the guard keeps stays
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert held / 100 < 1_000, held  # bytes per session, against 60 KB of schemas
    # The count still follows the schemas the session sends.
    fewer = large_tools("s0")[:10]
    threshold_now = cliff_of(
        guard.renderer(("acme", "s0"), "refold", request(1_000, fewer))
    ).threshold
    expected = threshold(WINDOW, 1_000, PRIOR_RATIO, tools_estimate(request(tools=fewer)))
    assert threshold_now == expected


async def test_a_tenants_replies_calibrate_only_its_own_new_sessions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another tenant's traffic moves no threshold of this one's: it would change its guard
    decisions, and tell it something of that traffic (a side channel)."""
    guard, _ = guard_over({"http://a": WINDOW})
    await guard.learn("m")

    def calibrate(tenant: str, session: str, ratio: float) -> None:
        guard.renderer((tenant, session), "refold", request(1_000))
        guard.rendered((tenant, session), 1_000, compacted=False)
        guard.observe((tenant, session), {"prompt_tokens": round(1_000 * ratio)})

    def first_threshold(tenant: str, session: str) -> int:
        return cliff_of(guard.renderer((tenant, session), "refold", request(1_000))).threshold

    prior = threshold(WINDOW, 1_000, PRIOR_RATIO, 0)
    calibrate("noisy", "n1", 2.5)  # a prompt far denser than the prior
    assert first_threshold("quiet", "q1") == prior
    assert first_threshold("noisy", "n2") == threshold(WINDOW, 1_000, rounded_ratio(2.5), 0)
    calibrate("quiet", "q2", 1.25)
    assert first_threshold("quiet", "q3") == threshold(WINDOW, 1_000, rounded_ratio(1.25), 0)
    assert first_threshold("noisy", "n3") == threshold(WINDOW, 1_000, rounded_ratio(2.5), 0)

    # The ratios of at most RECENT_TENANTS tenants are kept, the least recently observed
    # forgotten first: memory stays bounded however many tenants there are.
    monkeypatch.setattr(context_guard, "RECENT_TENANTS", 3)
    for tenant in ("t1", "t2", "t3"):
        calibrate(tenant, "s", 2.0)
    assert first_threshold("quiet", "q4") == prior
    assert first_threshold("t1", "new") == threshold(WINDOW, 1_000, rounded_ratio(2.0), 0)


async def test_one_tenants_many_sessions_keep_another_tenants_session() -> None:
    """The sessions the guard keeps are bounded per tenant: a tenant opening many sessions
    pushes out its own oldest, never another tenant's calibrated, compacted one."""
    guard, _ = guard_over({"http://a": WINDOW})
    await guard.learn("m")
    guard.renderer(("quiet", "q"), "refold", request(1_000))
    guard.rendered(("quiet", "q"), 1_000, compacted=True)
    guard.observe(("quiet", "q"), {"prompt_tokens": 2_510})
    guard.renderer(("noisy", "n0"), "refold", request(1_000))
    guard.rendered(("noisy", "n0"), 1_000, compacted=False)
    guard.observe(("noisy", "n0"), {"prompt_tokens": 2_010})
    assert guard.prompt_ratio(("noisy", "n0")) == rounded_ratio(2.01) != 2.01
    for index in range(1, context_guard.GUARDED_SESSIONS + 1):
        guard.renderer(("noisy", f"n{index}"), "refold", request(1_000))
    assert guard.prompt_ratio(("quiet", "q")) == rounded_ratio(2.51)
    # A compacted session's threshold only goes down: a bigger reply room keeps it.
    kept = cliff_of(guard.renderer(("quiet", "q"), "refold", request(100))).threshold
    assert kept == threshold(WINDOW, 1_000, rounded_ratio(2.51), 0)
    # The noisy tenant's own oldest session went: it reads its tenant's latest reply.
    assert guard.prompt_ratio(("noisy", "n0")) == 2.01


async def test_usage_without_a_guarded_render_calibrates_nothing() -> None:
    guard, _ = guard_over({"http://a": WINDOW})
    await guard.learn("m")
    guard.rendered(("acme", "s"), 100, compacted=False)
    guard.observe(("acme", "s"), {"prompt_tokens": 900})
    fresh = cliff_of(guard.renderer(("acme", "s"), "base", request(1_000)))
    assert fresh.threshold == threshold(WINDOW, 1_000, PRIOR_RATIO, 0)
    guard.rendered(("acme", "s"), 100, compacted=False)
    guard.observe(("acme", "s"), {"prompt_tokens": "many"})
    guard.observe(("acme", "s"), {})
    assert (
        cliff_of(guard.renderer(("acme", "s"), "base", request(1_000))).threshold == fresh.threshold
    )


# -- a session past the window, through the gateway ---------------------------------------

STEPS = 48
FAKE_WINDOW = 6_000
SUMMARY = "[Earlier conversation compacted"


def output(step: int) -> str:
    """A tool output of ~1,200 characters that repeats nothing (nothing for ReFold to stub)."""
    return "\n".join(
        f"{step}.{j}: value {(step * 7919 + j * 104729) % 1_000_003}" for j in range(48)
    )


def harness_messages(upto: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. " * 40},
        {"role": "user", "content": "Fix the failing test."},
    ]
    for i in range(upto):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
        messages.append({"role": "assistant", "content": f"step {i}", "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": output(i)})
    return messages


@pytest.mark.parametrize("strategy", ["refold", "base"])
async def test_a_session_past_the_window_compacts_before_a_refusal_and_keeps_its_prefix(
    tmp_path: Path, client: Any, strategy: str
) -> None:
    fake = await FakeUpstream(max_model_len=FAKE_WINDOW).start()
    config = GatewayConfig(
        store_url=f"sqlite:///{tmp_path}/store.db", replicas=(fake.url,), probe_interval_s=0.5
    )
    try:
        async with running_gateway(replace(config, strategy=strategy)) as url:
            for upto in range(STEPS):
                resp = await client.post(
                    f"{url}/v1/chat/completions",
                    json={
                        "model": "m",
                        "messages": harness_messages(upto),
                        "tools": list(TOOLS),
                        "max_tokens": 256,
                    },
                    headers={"x-session-id": f"guard-{strategy}"},
                )
                assert resp.status_code == 200, resp.text
    finally:
        await fake.stop()
    raw = FakeUpstream.prompt_tokens({"messages": harness_messages(STEPS - 1), "tools": TOOLS})
    assert raw > 2 * FAKE_WINDOW  # the session outgrew the window twice over
    assert fake.refused == []  # no request was ever refused: compacted before, every time
    sent = fake.requests
    assert len(sent) == STEPS
    sizes = [FakeUpstream.prompt_tokens(body) for body in sent]
    assert max(sizes) <= FAKE_WINDOW - 256
    summaries = [
        m[2]["content"] if len(m) > 2 and SUMMARY in str(m[2]["content"]) else None
        for m in (body["messages"] for body in sent)
    ]
    first = next(i for i, summary in enumerate(summaries) if summary)
    assert all(summaries[first:])
    compactions = [i for i in range(first, STEPS) if summaries[i] != summaries[i - 1]]
    # Each compaction holds for several requests: the cut moves at a crossing, not before.
    assert all(b - a >= 4 for a, b in pairwise(compactions)), compactions
    for i in range(first + 1, STEPS):
        if i in compactions:
            continue
        before, now = sent[i - 1]["messages"], sent[i]["messages"]
        # The head and the summary are sent again byte for byte...
        assert now[:3] == before[:3]
        if strategy == "base":
            # ... and with nothing rewritten by the strategy, all that was sent before.
            assert now[: len(before)] == before
