"""The peer arms of the experiments: vllm-router cells and GatewayConfig variants parsed from
a profile, the router process started and stopped against the FAKE upstream, and the
report's peer rows beside foldgate's, judged by the simulator comparison's tie rule."""

from __future__ import annotations

import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploy.cpu.replicas import free_ports
from deploy.cpu.vllm_server import KV_EVENTS_PORT_OFFSET, kv_events_args, kv_events_endpoint
from loadtests.cell_processes import (
    ExperimentError,
    gateway_env,
    router_command,
    toml_text,
    vllm_router,
)
from loadtests.experiment import run_order
from loadtests.plan import PlanError, load_profile, unknown_overrides
from loadtests.report_answers import answers, verdict
from loadtests.report_tables import aggregate, table
from loadtests.results import capacity, session_times
from router.cost import get_preset

ROOT = Path(__file__).resolve().parents[2]

PROFILE = """
[defaults]
trajectories = ["runs"]
model = "tiny"
replicas = 2
block_size = 32
max_model_len = 4096
run_time_s = 60
arm = "gateway"
strategy = "refold"
routing = "sticky"
server = "uvicorn"
users = 2
kv_cache_bytes = "8M"
load = "sessions"

[profiles.p]
runs = 2
kv_events = true
default_variant = "on"
[profiles.p.variants]
on = { upstream_priority = true, admission_max_wait_s = 2.5 }
off = { upstream_priority = false }
[[profiles.p.matrix]]
variant = ["on", "off"]
think_time = ["0", "2:0.5"]
[[profiles.p.matrix]]
arm = "vllm_router"
router_policy = ["consistent_hash", "kv_aware"]
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "experiments.toml"
    path.write_text(text)
    return path


def test_a_profile_names_router_cells_variants_and_think_times(tmp_path: Path) -> None:
    profile = load_profile("p", write(tmp_path, PROFILE))
    assert [c.name for c in profile.cells] == [
        "refold_sticky_on_u2_kv8M",
        "refold_sticky_on_u2_think2_kv8M",
        "refold_sticky_off_u2_kv8M",
        "refold_sticky_off_u2_think2_kv8M",
        "vllm-router_consistent-hash_u2_kv8M",
        "vllm-router_kv-aware_u2_kv8M",
    ]
    on = profile.cells[0]
    assert on.overrides == (("admission_max_wait_s", 2.5), ("upstream_priority", True))
    router = profile.cells[-1]
    assert (router.arm, router.router_policy, router.routing, router.overrides) == (
        "vllm_router", "kv_aware", "-", ()
    )  # fmt: skip
    assert profile.settings.runs == 2 and profile.settings.kv_events
    # every override names a GatewayConfig field; one that does not is named before a run
    assert unknown_overrides(profile) == []
    misspelt = PROFILE.replace("admission_max_wait_s", "admission_max_wait")
    unknown = unknown_overrides(load_profile("p", write(tmp_path, misspelt)))
    assert "refold_sticky_on_u2_kv8M: admission_max_wait" in unknown
    # every run of the pool, the order reversed on the second
    order = [(run, c.name) for run, c in run_order(profile)]
    assert order[:6] == [(1, c.name) for c in profile.cells]
    assert order[6:] == [(2, c.name) for c in reversed(profile.cells)]


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('"consistent_hash", "kv_aware"]', '"random"]', "router_policy must be one of"),
        ('variant = ["on", "off"]', 'variant = ["sideways"]', "no variant 'sideways'"),
        ('think_time = ["0", "2:0.5"]', 'think_time = ["soon"]', "think time must be MEDIAN"),
        ("runs = 2", "runs = 0", "runs must be at least 1"),
        ("off = { upstream_priority = false }", "off = { tenants = {} }", "must be a scalar"),
    ],
)
def test_bad_peer_settings_are_refused_with_the_reason(
    tmp_path: Path, old: str, new: str, message: str
) -> None:
    assert old in PROFILE
    with pytest.raises(PlanError, match=message):
        load_profile("p", write(tmp_path, PROFILE.replace(old, new)))


def test_the_shipped_peer_profiles_load() -> None:
    peers = load_profile("peers")
    policies = {c.router_policy for c in peers.cells if c.arm == "vllm_router"}
    assert {"cache_aware", "consistent_hash", "sticky_least_loaded", "kv_aware"} <= policies
    assert {c.arm for c in peers.cells} == {"gateway", "vllm_router", "no_gateway"}
    assert {c.think_time for c in peers.cells} == {"0", "2:0.5"}
    assert peers.settings.runs >= 2 and peers.settings.kv_events
    pressure = load_profile("pressure")
    variants = {c.variant: dict(c.overrides) for c in pressure.cells if c.arm == "gateway"}
    assert set(variants) == {"kv_on", "kv_on_tiny", "kv_off"}
    # kv_on prices with the preset of its loaded replicas, through the gateway's config file.
    assert get_preset(variants["kv_on"]["cost_model"]).name == "cpu-tiny-loaded"
    kv_on = next(c for c in pressure.cells if c.variant == "kv_on")
    assert "FOLDGATE_COST_MODEL" not in gateway_env(kv_on, pressure.settings, Path("/x"))
    kv_off = next(c for c in pressure.cells if c.variant == "kv_off")
    env = gateway_env(kv_off, pressure.settings, Path("/x"))
    assert env["FOLDGATE_COST_MODEL"] == pressure.settings.cost_model == "cpu-tiny"
    assert pressure.settings.step_users == (2, 4, 8, 12, 16)
    assert min(c.users for c in pressure.cells if c.load == "sessions") >= 8


def test_variant_overrides_are_written_as_toml_the_gateway_reads() -> None:
    overrides = (("admission", True), ("admission_max_wait_s", 2.5), ("cost_model", 'a"b'))
    assert tomllib.loads(toml_text(overrides)) == dict(overrides)


def test_kv_aware_subscribes_to_each_replicas_events_where_the_replica_binds() -> None:
    urls = ["http://127.0.0.1:8100", "http://127.0.0.1:8101"]
    args = kv_events_args(8100)
    config = args[args.index("--kv-events-config") + 1]
    assert f'"tcp://*:{8100 + KV_EVENTS_PORT_OFFSET}"' in config  # vLLM binds only for "*"
    settings = load_profile("peers").settings
    cmd = router_command("kv_aware", 9000, 9001, urls, settings)
    sources = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--kv-event-source"]
    assert sources == [f"{u}={kv_events_endpoint(u)}" for u in urls]
    assert kv_events_endpoint(urls[1]) == f"tcp://127.0.0.1:{8101 + KV_EVENTS_PORT_OFFSET}"
    assert cmd[cmd.index("--kv-event-block-size") + 1] == str(settings.block_size)
    with pytest.raises(ExperimentError, match="kv_events = true"):
        router_command("kv_aware", 9000, 9001, urls)


def test_vllm_router_starts_in_front_of_the_fake_upstream_routes_and_stops(
    tmp_path: Path,
) -> None:
    (port,) = free_ports(1)
    upstream = f"http://127.0.0.1:{port}"
    fake = subprocess.Popen(
        [sys.executable, "-m", "loadtests.fake_upstream", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{upstream}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        log = tmp_path / "router.log"
        with vllm_router("consistent_hash", load_profile("peers").settings, [upstream], log) as (
            url,
            proc,
        ):
            body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
            reply = httpx.post(
                f"{url}/v1/chat/completions",
                json={**body, "stream": True},
                headers={"X-Session-ID": "s1"},
                timeout=10,
            )
            assert reply.status_code == 200 and "data: [DONE]" in reply.text
        assert proc.poll() is not None  # stopped with the block
    finally:
        fake.terminate()
        fake.wait(10)


def row(cell: str, arm: str, run: int, **figures: Any) -> dict[str, Any]:
    base = {
        "cell": cell, "arm": arm, "run": run, "strategy": "refold", "routing": "sticky_cost",
        "router_policy": "-", "variant": "", "users": 4, "kv_cache_bytes": 6 * 2**20,
        "server": "uvicorn", "load": "sessions", "think_time": "0",
    }  # fmt: skip
    if arm == "vllm_router":
        policy = cell.split("_")[1].replace("-", "_")
        base.update(strategy="-", routing="-", router_policy=policy, server="-")
    return {**base, **figures}


def test_the_report_puts_peer_rows_beside_foldgates_and_applies_the_tie_rule() -> None:
    runs = [
        row("refold_sticky-cost_u4_kv6M", "gateway", 1,
            vllm_prefix_hit_rate=0.80, ttft_p50_ms=300.0),
        row("refold_sticky-cost_u4_kv6M", "gateway", 2,
            vllm_prefix_hit_rate=0.78, ttft_p50_ms=340.0),
        row("vllm-router_cache-aware_u4_kv6M", "vllm_router", 1,
            vllm_prefix_hit_rate=0.60, ttft_p50_ms=320.0),
        row("vllm-router_cache-aware_u4_kv6M", "vllm_router", 2,
            vllm_prefix_hit_rate=0.62, ttft_p50_ms=330.0),
        row("vllm-router_consistent-hash_u4_kv6M", "vllm_router", 1,
            vllm_prefix_hit_rate=0.70, ttft_p50_ms=400.0),
        row("vllm-router_consistent-hash_u4_kv6M", "vllm_router", 2,
            vllm_prefix_hit_rate=0.71, ttft_p50_ms=420.0),
    ]  # fmt: skip
    rows = aggregate(runs)
    assert [r["runs"] for r in rows] == [2, 2, 2]
    assert rows[0]["vllm_prefix_hit_rate"] == pytest.approx(0.79)
    assert rows[0]["spread"]["ttft_p50_ms"] == (300.0, 340.0)
    text = "\n".join(answers(rows, runs))
    # the routing table holds the peer rows, each figure with its runs' range
    assert "| vllm-router_cache-aware_u4_kv6M | vllm-router cache_aware | 61.0% (60.0%–62.0%)" in (
        text
    )
    # prefix hit: best peer consistent_hash (70.5%), 8.5 points behind, past both spreads
    assert "| prefix hit | 79.0% | 70.5% | consistent_hash | foldgate ahead |" in text
    # TTFT p50: best peer cache_aware (325 ms) against 320 ms, within foldgate's 40 ms spread
    assert "| TTFT p50 ms | 320 | 325 | cache_aware | tie (within the runs' spread) |" in text
    assert verdict([1.0], [2.0], higher_better=True).startswith("vllm-router ahead")
    assert "| refold_sticky-cost_u4_kv6M | foldgate sticky_cost (refold) |" in table(rows, ())


def test_session_times_and_capacity() -> None:
    requests = [
        {"session": "a", "start": 0.0, "end": 2.0, "ok": True},
        {"session": "a", "start": 5.0, "end": 9.5, "ok": True},
        {"session": "b", "start": 1.0, "end": 3.0, "ok": True},
        {"session": "c", "start": 1.0, "end": 8.0, "ok": False},  # did not complete
    ]
    assert sorted(session_times(requests)) == [2.0, 9.5]
    stages = [
        {"users": 2, "ttft_p95_ms": 400.0, "failed": 0},
        {"users": 4, "ttft_p95_ms": 1900.0, "failed": 0},
        {"users": 8, "ttft_p95_ms": 2600.0, "failed": 0},
        {"users": 12, "ttft_p95_ms": 1500.0, "failed": 0},  # past the first breach: not counted
    ]
    assert capacity(stages, 2000.0) == 4
    assert capacity(stages, 100.0) == 0
