"""What an operator would put in front of vLLM instead of foldgate, for ``bench/overhead.py``:
vLLM's own router (``vllm-router``, the ``peers`` extra) and a LiteLLM proxy (its own venv,
``scripts/litellm-venv.sh``), each a process in front of the fake upstream, started and
stopped like the gateway; and the curve ``--curve`` draws: added latency and requests per
CPU-second over history size and concurrent sessions, every front in one interleaved loop.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from statistics import median, quantiles
from typing import Any

import aiohttp

from bench.harness import ROOT, post, process, wait_ready
from bench.workload import request_bodies, synthetic_session
from deploy.cpu.replicas import free_ports
from loadtests.cell_processes import router_command, tree_cpu_s
from loadtests.fake_upstream import FAKE_MODEL

VLLM_ROUTER, LITELLM = "vllm-router", "LiteLLM proxy"
LITELLM_VENV = ROOT / ".litellm-venv"
LITELLM_HINT = "bash scripts/litellm-venv.sh (creates .litellm-venv)"
# Bytes of history per token in the synthetic session (numbered source lines): what turns
# the curve's token sizes into its sessions' sizes.
BYTES_PER_TOKEN = 4
# The proxy refuses to start without a master key (LiteLLM 1.110); a fresh one per run, sent
# as a client's bearer token (``front_headers``), so its per-request auth check is measured.
LITELLM_KEY = f"sk-{uuid.uuid4().hex}"


def front_headers(name: str) -> dict[str, str]:
    """Headers a client of front ``name`` sends besides the body's."""
    return {"authorization": f"Bearer {LITELLM_KEY}"} if name == LITELLM else {}


def litellm_config(upstream: str) -> str:
    """A proxy config with one OpenAI-compatible deployment: the fake upstream."""
    config = {
        "model_list": [
            {
                "model_name": FAKE_MODEL,
                "litellm_params": {
                    "model": f"openai/{FAKE_MODEL}",
                    "api_base": f"{upstream}/v1",
                    "api_key": "unused",
                },
            }
        ],
        "litellm_settings": {"drop_params": True, "turn_off_message_logging": True},
        "general_settings": {"master_key": LITELLM_KEY},
    }
    return json.dumps(config)  # JSON is YAML


def start_peers(
    running: ExitStack, upstream: str, tmp: Path, router_policy: str, litellm: bool = True
) -> dict[str, tuple[str, subprocess.Popen, Path, str]]:
    """Start vllm-router (``router_policy``) and, when its venv exists (or ``litellm`` is
    asked for: then it must), the LiteLLM proxy in front of ``upstream``; each stops with
    ``running``. name -> (base URL, process, log, readiness URL)."""
    router_port, metrics_port, litellm_port = free_ports(3)
    started = {}
    argv = router_command(router_policy, router_port, metrics_port, [upstream])
    log = tmp / "vllm-router.log"
    proc = running.enter_context(process(argv, log, {"RUST_LOG": "warn"}))
    url = f"http://127.0.0.1:{router_port}"
    started[VLLM_ROUTER] = (url, proc, log, f"{url}/readiness")
    binary = LITELLM_VENV / "bin" / "litellm"
    if litellm and not binary.is_file():
        raise SystemExit(f"no LiteLLM proxy at {binary}: {LITELLM_HINT} (or pass --no-litellm)")
    if litellm:
        config = tmp / "litellm.yaml"
        config.write_text(litellm_config(upstream))
        argv = [str(binary), "--config", str(config), "--host", "127.0.0.1"]
        argv += ["--port", str(litellm_port), "--num_workers", "1"]
        log = tmp / "litellm.log"
        # No network here: the model cost map is the one shipped in the package.
        env = {"LITELLM_LOG": "ERROR", "LITELLM_LOCAL_MODEL_COST_MAP": "True", "PYTHONPATH": ""}
        proc = running.enter_context(process(argv, log, env))
        url = f"http://127.0.0.1:{litellm_port}"
        started[LITELLM] = (url, proc, log, f"{url}/health/liveliness")
    return started


async def wait_peers(started: Mapping[str, tuple[str, subprocess.Popen, Path, str]]) -> None:
    for _, proc, log, ready in started.values():
        await wait_ready(ready, proc, log)


def sized_bodies(tokens: int, steps: int) -> list[bytes]:
    """A synthetic session whose last request holds about ``tokens`` tokens of history."""
    return request_bodies(synthetic_session(steps, tokens * BYTES_PER_TOKEN // 1024), steps)


async def curve_point(
    fronts: Mapping[str, str],
    pids: Mapping[str, int],
    upstream: str,
    bodies: Sequence[bytes],
    sessions: int,
    per_session: int,
    rounds: int,
) -> dict[str, dict[str, float]]:
    """``rounds`` times: ``sessions`` new sessions are opened (one untimed request each,
    every front, all of them answered before timing starts), then run concurrently, each
    sending its last ``per_session`` requests directly and through every front, the order
    rotating per request: added latency = front - direct for the same body in the same
    session. The opening requests are a session's first, read whole by a gateway; left out
    of the timed phase, they do not queue ahead of the timed ones: the figures are those of
    sessions in mid-run. Requests per CPU-second: each front's timed requests over the CPU
    its process tree spent in the timed phases."""
    json_type = {"content-type": "application/json"}
    timed = list(bodies[-per_session:])
    warm = bodies[-per_session - 1]
    added: dict[str, list[float]] = {name: [] for name in fronts}
    served = dict.fromkeys(fronts, 0)
    cpu = dict.fromkeys(fronts, 0.0)
    failed: dict[str, list[str]] = {name: [] for name in ("direct", *fronts)}
    Call = tuple[str, str, dict[str, str]]

    async def send(http: aiohttp.ClientSession, name: str, url: str, body: bytes,
                   headers: dict[str, str]) -> float | None:  # fmt: skip
        """Seconds for the whole reply; None (and the reason kept) when it failed."""
        try:
            return await post(http, url, body, headers)
        except (RuntimeError, aiohttp.ClientError, TimeoutError) as exc:
            failed[name].append(str(exc) or type(exc).__name__)
            return None

    async def open_session(http: aiohttp.ClientSession) -> list[Call]:
        calls = [("direct", f"{upstream}/v1/chat/completions", json_type)]
        for name, url in fronts.items():
            headers = {**json_type, "x-session-id": f"curve-{uuid.uuid4()}"}
            headers |= front_headers(name)
            calls.append((name, f"{url}/v1/chat/completions", headers))
        for name, url, headers in calls[1:]:
            await send(http, name, url, warm, headers)
        return calls

    async def one_session(http: aiohttp.ClientSession, index: int, calls: list[Call]) -> None:
        for t, body in enumerate(timed):
            turn = (index + t) % len(calls)
            took = {}
            for name, url, headers in calls[turn:] + calls[:turn]:
                took[name] = await send(http, name, url, body, headers)
            for name in fronts:
                if took[name] is not None:
                    served[name] += 1
                    if took["direct"] is not None:
                        added[name].append(took[name] - took["direct"])

    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=900)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        for _ in range(rounds):
            opened = await asyncio.gather(*(open_session(http) for _ in range(sessions)))
            cpu_before = {name: tree_cpu_s(pid) for name, pid in pids.items()}
            await asyncio.gather(*(one_session(http, i, c) for i, c in enumerate(opened)))
            for name, pid in pids.items():
                cpu[name] += tree_cpu_s(pid) - cpu_before[name]
    nan = float("nan")
    return {
        name: {
            "added_ms_p50": median(added[name]) * 1e3 if added[name] else nan,
            "added_ms_p99": _p99(added[name]) * 1e3 if added[name] else nan,
            "req_per_cpu_s": served[name] / cpu[name] if cpu[name] > 0 else nan,
            "cpu_s": cpu[name],
            "samples": len(added[name]),
            "failed": len(failed[name]),
            "first_failure": failed[name][0] if failed[name] else "",
            "direct_failed": len(failed["direct"]),
        }
        for name in fronts
    }


def _p99(samples: list[float]) -> float:
    if len(samples) < 2:
        return samples[0]
    return quantiles(samples, n=100, method="inclusive")[98]


async def curve(
    fronts: Mapping[str, str],
    pids: Mapping[str, int],
    upstream: str,
    sizes: Sequence[int],
    concurrencies: Sequence[int],
    steps: int,
    samples: int,
    per_session: int,
) -> list[dict[str, Any]]:
    """Every (history size, concurrency) point: rounds of new sessions, each timing its
    last ``per_session`` requests (the history within ``per_session / steps`` of the
    point's size), until about ``samples`` timed requests per front (at least one round)."""
    rows = []
    for tokens in sizes:
        bodies = sized_bodies(tokens, steps)
        for sessions in concurrencies:
            rounds = max(1, -(-samples // (sessions * per_session)))
            point = await curve_point(fronts, pids, upstream, bodies, sessions, per_session, rounds)
            body_bytes = median(len(b) for b in bodies[-per_session:])
            for name, figures in point.items():
                rows.append(
                    {
                        "front": name,
                        "history_tokens": tokens,
                        "body_kb": body_bytes / 1024,
                        "sessions": sessions,
                        "rounds": rounds,
                        **figures,
                    }
                )
    return rows


def plot_curve(rows: Sequence[dict[str, Any]], path: Path, title: str) -> None:
    """Added latency p50 (solid) and p99 (dashed) and requests per CPU-second over history
    size, one panel pair per concurrency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    concurrencies = sorted({r["sessions"] for r in rows})
    fronts = list(dict.fromkeys(r["front"] for r in rows))
    fig, axes = plt.subplots(2, len(concurrencies), figsize=(4.2 * len(concurrencies), 7))
    axes = axes.reshape(2, len(concurrencies))
    for col, sessions in enumerate(concurrencies):
        lat, cpu = axes[0][col], axes[1][col]
        for i, front in enumerate(fronts):
            points = sorted(
                (r for r in rows if r["front"] == front and r["sessions"] == sessions),
                key=lambda r: r["history_tokens"],
            )
            xs = [r["history_tokens"] / 1000 for r in points]
            color = f"C{i}"
            lat.plot(xs, [r["added_ms_p50"] for r in points], "o-", color=color, label=front)
            lat.plot(xs, [r["added_ms_p99"] for r in points], "o--", color=color, alpha=0.6)
            cpu.plot(xs, [r["req_per_cpu_s"] for r in points], "o-", color=color, label=front)
        lat.set(title=f"{sessions} concurrent session(s)", xscale="log", yscale="log")
        lat.set(xlabel="history (k tokens)", ylabel="added ms (p50 solid, p99 dashed)")
        cpu.set(xscale="log", yscale="log", xlabel="history (k tokens)", ylabel="requests / CPU-s")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
