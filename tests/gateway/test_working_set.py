"""Working-set admission, pause reservation and vLLM priority through a real gateway (real
store: Redis) in front of two FAKE upstreams (instant replies after a scripted delay: what
is tested is the gateway's waiting, not a model's serving)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from dataclasses import replace

import httpx
import pytest
from prometheus_client import REGISTRY

from gateway.config import GatewayConfig
from gateway.steps.kv import first_token
from loadtests.fake_upstream import FakeUpstream, ScriptedReply
from loadtests.local_servers import running_gateway

SESSIONS = 8
STEPS = 3
# Each session's prompt: ~4,000 characters of JSON, ~1,000 tokens by the fake's count and
# the gateway's estimate; two replicas of 2,500 tokens: two sessions fit on each (at 0.9).
PROMPT_CHARS = 4000
POOL_TOKENS = 2500
MAX_WAIT_S = 1.5
# A waiter wakes at its deadline; the loop may run it later by what it lagged then (a
# loaded 2-core machine: 0.56 s once), which the ticker below measures.
TICK_S = 0.01
TIMER_S = 0.05  # a timer's own granularity beside the ticker's period


class LoopLag:
    """The longest the event loop ran a timer late while the block ran."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        while True:
            due = time.monotonic() + TICK_S
            await asyncio.sleep(TICK_S)
            self.longest = max(self.longest, time.monotonic() - due)

    async def __aenter__(self) -> LoopLag:
        self._task = asyncio.create_task(self._tick())
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


def body(session: int, step: int) -> dict:
    messages = [{"role": "system", "content": f"agent {session} " + "x" * PROMPT_CHARS}]
    for i in range(step):
        messages += [
            {"role": "user", "content": f"step {i}"},
            {"role": "assistant", "content": f"done {i}"},
        ]
    messages.append({"role": "user", "content": f"step {step}"})
    return {"model": "m", "messages": messages, "max_tokens": 8, "stream": False}


# The x-foldgate-admission header of every reply ``drive`` got, by session, in step order.
OUTCOMES: dict[int, list[str]] = {}


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def drive(url: str, run: str, session: int, think_s: float) -> list[float]:
    """One agent session: STEPS requests with a think time between; the admission wait
    each reply's header reports (and, in ``OUTCOMES``, how it went)."""
    waits = []
    async with httpx.AsyncClient(timeout=60) as http:
        for step in range(STEPS):
            resp = await http.post(
                f"{url}/v1/chat/completions",
                json=body(session, step),
                headers={"x-session-id": f"{run}-s{session}", "x-foldgate-strategy": "base"},
            )
            assert resp.status_code == 200, resp.text
            waits.append(float(resp.headers["x-foldgate-admission-wait"]))
            OUTCOMES.setdefault(session, []).append(resp.headers["x-foldgate-admission"])
            await asyncio.sleep(think_s)  # the agent's tool call (simulated pause)
    return waits


async def run(config: GatewayConfig, reply: ScriptedReply, think_s: float):
    fakes = [await FakeUpstream(default=reply).start() for _ in range(2)]
    try:
        config = replace(config, replicas=tuple(f.url for f in fakes))
        run = uuid.uuid4().hex[:8]  # the store (one Redis per test session) is shared
        async with running_gateway(config) as url:
            waits = await asyncio.gather(*(drive(url, run, s, think_s) for s in range(SESSIONS)))
            async with httpx.AsyncClient(timeout=30) as http:
                logs = [
                    (await http.get(f"{url}/v1/sessions/{run}-s{s}")).json()["log"]
                    for s in range(SESSIONS)
                ]
        return waits, logs, [r for f in fakes for r in f.requests]
    finally:
        for f in fakes:
            await f.stop()


def kv_config(redis_url: str, **overrides) -> GatewayConfig:
    settings = {
        "admission": True,
        "admission_max_wait_s": MAX_WAIT_S,
        "kv_pool_tokens": POOL_TOKENS,
        "pause_reservation": True,
        "reservation_max_s": 1.0,
        "upstream_priority": True,
    }
    return GatewayConfig(store_url=redis_url, probe_interval_s=0.5, **{**settings, **overrides})


@pytest.mark.parametrize("work_conserving", [False, True], ids=["waiting", "priced"])
async def test_more_sessions_than_fit_all_complete_with_the_wait_bounded(
    redis_url, work_conserving
):
    before = {o: sample("foldgate_admission_wait_seconds_count", outcome=o) for o in
              ("admitted", "waited", "priced", "timed_out")}  # fmt: skip
    reply = ScriptedReply(content="ok", first_chunk_delay_s=0.3)
    OUTCOMES.clear()
    config = kv_config(redis_url, admission_work_conserving=work_conserving)
    async with LoopLag() as lag:
        told, logs, bodies = await run(config, reply, think_s=0.2)
    # Every session completed every step; new sessions spread over both replicas by the
    # room beside their sets, and a request that waited for room on its session's replica
    # went there (``binds_placement``; one admitted at once may move as the policy says).
    assert [len(log) for log in logs] == [STEPS] * SESSIONS
    assert len({log[0]["replica"] for log in logs}) == 2, logs
    for s, log in enumerate(logs):
        for step in range(1, STEPS):
            if OUTCOMES[s][step] == "waited":
                assert log[step]["replica"] == log[step - 1]["replica"], (s, log)
    waits = [r["admission_wait_s"] for log in logs for r in log]
    # Each reply tells its client the wait its log records (to the millisecond).
    assert told == [[round(r["admission_wait_s"], 3) for r in log] for log in logs]
    # None waited longer than the bound.
    assert max(waits) <= MAX_WAIT_S + lag.longest + TIMER_S, (lag.longest, waits)
    counted = {
        o: sample("foldgate_admission_wait_seconds_count", outcome=o) - before[o] for o in before
    }
    assert sum(counted.values()) == SESSIONS * STEPS
    # Each reply names how it went, as the metric counts it.
    outcomes = [o for s in range(SESSIONS) for o in OUTCOMES[s]]
    assert {o: outcomes.count(o) for o in before} == counted
    if work_conserving:
        # Twice as many sessions as fit, the room held by running requests or by paused
        # members whose restores cost less than a wait: some went before room came.
        assert counted["priced"] > 0, counted
    else:
        # Twice as many sessions as fit: some waited for room or the bound.
        assert max(waits) > 0.05, waits
        assert counted["waited"] + counted["timed_out"] > 0, counted
    # Priority: a session's first request is a cold start (1), a continuing one on the
    # replica that holds it is warm (0); every request carries one.
    assert all(b["priority"] in (0, 1) for b in bodies)
    first = [log[0]["priority"] for log in logs]
    assert first == [1] * SESSIONS
    assert any(r["priority"] == 0 for log in logs for r in log[1:])


async def test_a_tenants_priority_composes_with_the_sessions_class(redis_url):
    config = kv_config(redis_url, tenants={"*": {"priority": -1}}, admission=False)
    _, logs, bodies = await run(config, ScriptedReply(content="ok"), think_s=0.0)
    # -1 * 2 + class: -1 for a cold start, -2 for a warm continuation.
    assert {log[0]["priority"] for log in logs} == {-1}
    assert {r["priority"] for log in logs for r in log[1:]} <= {-1, -2}
    assert {b["priority"] for b in bodies} <= {-1, -2}


async def test_switched_off_the_upstream_requests_and_logs_are_todays(redis_url):
    """With every switch off (the defaults) nothing of this step reaches the upstream or
    waits: the bodies carry neither priority nor session_id, the logs record no wait and
    priority 0, and the bodies equal those of a gateway configured with every switch
    explicitly off."""
    reply = ScriptedReply(content="ok")
    default = GatewayConfig(store_url=redis_url, probe_interval_s=0.5)
    off = replace(
        kv_config(redis_url),
        admission=False,
        pause_reservation=False,
        upstream_priority=False,
        kv_events=False,
    )
    OUTCOMES.clear()
    told, logs, bodies = await run(default, reply, think_s=0.0)
    assert {o for s in OUTCOMES.values() for o in s} == {"off"}
    _, _, bodies_off = await run(off, reply, think_s=0.0)
    assert not any("priority" in b or "session_id" in b for b in bodies)
    assert {(r["admission_wait_s"], r["priority"]) for log in logs for r in log} == {(0.0, 0)}
    assert {w for waits in told for w in waits} == {0.0}

    def canonical(bs: list[dict]) -> list[str]:
        return sorted(str(sorted(b.items())) for b in bs)

    assert canonical(bodies) == canonical(bodies_off)


async def test_with_price_fit_admission_prices_at_what_the_replicas_first_tokens_took(redis_url):
    """A fake whose first chunk takes 2 ms per prompt token: the price admission weighs
    restores with (its gauge) comes from the replies, not the cost model's 24 us."""
    per_token_s = 2e-3
    reply = ScriptedReply(content="ok", first_chunk_delay_s=0.02, prefill_s_per_token=per_token_s)
    fakes = [await FakeUpstream(default=reply).start() for _ in range(2)]
    config = GatewayConfig(
        store_url=redis_url,
        probe_interval_s=0.5,
        replicas=tuple(f.url for f in fakes),
        admission=True,
        admission_price_fit=True,
        kv_pool_tokens=1_000_000,  # everything fits: nobody waits, every reply is priced
        cost_model="cpu-tiny",
    )
    run = uuid.uuid4().hex[:8]

    async def session(n: int) -> None:
        async with httpx.AsyncClient(timeout=60) as http:
            for step in range(2):
                messages = [{"role": "system", "content": "x" * (400 * (n + 1))}]
                messages.append({"role": "user", "content": f"step {step}"})
                resp = await http.post(
                    f"{url}/v1/chat/completions",
                    json={"model": "m", "messages": messages, "max_tokens": 8},
                    headers={"x-session-id": f"{run}-p{n}", "x-foldgate-strategy": "base"},
                )
                assert resp.status_code == 200, resp.text

    try:
        async with running_gateway(config) as url:
            await asyncio.gather(*(session(n) for n in range(8)))
        price = sample("foldgate_admission_prefill_price_seconds")
        assert per_token_s / 2 < price < per_token_s * 2, price
    finally:
        for f in fakes:
            await f.stop()


def test_a_reply_tells_its_prefill_only_when_one_request_with_cached_counts_answered_it():
    usage = {"prompt_tokens": 1_000, "prompt_tokens_details": {"cached_tokens": 600}}
    assert first_token([usage], 0.4) == (400, 0.4)
    assert first_token([usage, usage], 0.4) is None  # a restore: two requests' times
    assert first_token([{"prompt_tokens": 1_000}], 0.4) is None  # no cached count
    assert first_token([usage], None) is None  # no first chunk timed


async def test_a_reply_that_calls_no_tool_ends_the_turn_and_reserves_nothing(redis_url, tmp_path):
    """A tool-calling session: the reply that calls a tool pauses it (its footprint stays
    reserved on its replica through the tool's run); the reply that calls none ended the
    agent's turn, so its share goes at once and nothing is held for a pause not coming."""
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    trace = tmp_path / "admission.jsonl"
    fake = await FakeUpstream(
        script=[ScriptedReply(content="", tool_calls=[("bash", '{"cmd": "ls"}')])],
        default=ScriptedReply(content="all done"),
    ).start()
    config = replace(
        kv_config(
            redis_url, admission_trace=str(trace), reservation_max_s=30.0,
            kv_pool_tokens=50_000,
        ),
        replicas=(fake.url,),
    )  # fmt: skip
    session = f"turn-{uuid.uuid4().hex[:8]}"
    # Long enough that its re-prefill costs more than a reservation's step (``reservation_s``).
    system = {"role": "system", "content": "You are a coding agent. " * 800}
    messages: list[dict] = [system, {"role": "user", "content": "list the files"}]
    try:
        async with running_gateway(config) as url, httpx.AsyncClient(timeout=30) as http:
            for _ in range(2):
                resp = await http.post(
                    f"{url}/v1/chat/completions",
                    json={"model": "m", "messages": messages, "tools": tools, "max_tokens": 8},
                    headers={"x-session-id": session, "x-foldgate-strategy": "base"},
                )
                assert resp.status_code == 200, resp.text
                reply = resp.json()["choices"][0]["message"]
                messages.append({k: v for k, v in reply.items() if v is not None})
                for call in reply.get("tool_calls") or []:
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": "a b"})
    finally:
        await fake.stop()
    assert messages[2].get("tool_calls") and messages[-1]["content"] == "all done"
    ended = [
        line
        for line in map(json.loads, trace.read_text().splitlines())
        if line["event"] == "ended" and line["session"].endswith(session)
    ]
    assert [line["pausing"] for line in ended] == [True, False]
    key = ended[0]["session"]
    _, running, reserved_s = ended[0]["state"]["members"][key]
    assert running == 0 and reserved_s > 0  # paused through the tool call, reserved
    assert key not in ended[1]["state"]["members"]  # the turn ended: out of the set
