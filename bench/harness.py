"""The processes a benchmark runs (the fake upstream, ``foldgate serve`` on uvicorn or Ray
Serve) and how it talks to them: start in a process group, wait for readiness, time a
request, count a process's CPU seconds thread by thread (a process tree's:
``loadtests.cell_processes.tree_cpu_s``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

import aiohttp

from deploy.cpu.replicas import free_ports
from gateway.serve_ray import fast_path_env

ROOT = Path(__file__).resolve().parent.parent
FOLDGATE = Path(sys.executable).parent / "foldgate"
START_TIMEOUT_S = 120.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """User+system CPU seconds of each live thread of ``pid`` (Linux /proc), by thread id:
    the main thread's id is ``pid``."""
    out: dict[int, float] = {}
    for entry in os.listdir(f"/proc/{pid}/task"):
        if (fields := _stat_fields(f"/proc/{pid}/task/{entry}/stat")) is not None:
            out[int(entry)] = _cpu_seconds(fields)
    return out


def _stat_fields(path: str) -> list[str] | None:
    """The fields of a /proc ``stat`` file after the command name; None once it is gone."""
    try:
        with open(path) as f:
            stat = f.read()
    except OSError:
        return None  # a process or thread that ended
    # The command name may hold spaces; fields resume after its closing bracket.
    return stat[stat.rindex(")") + 2 :].split()


def _cpu_seconds(fields: list[str]) -> float:
    """User+system CPU seconds from ``_stat_fields``' fields (utime, stime)."""
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


@contextmanager
def process(
    argv: Sequence[str], log: Path, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen]:
    """Run ``argv`` in its own process group; SIGTERM (then SIGKILL) that group at exit."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            list(argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            cwd=ROOT,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        # Ray's own children may outlive the driver for a moment.
        signal_group(proc.pid, signal.SIGKILL)


def signal_group(pgid: int, sig: int) -> None:
    with suppress(ProcessLookupError):
        os.killpg(pgid, sig)


async def wait_ready(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{url} exited during start:\n{log_tail(log)}")
            try:
                async with http.get(url) as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.25)
    raise RuntimeError(f"{url} not ready after {START_TIMEOUT_S:.0f} s:\n{log_tail(log)}")


def log_tail(log: Path, lines: int = 30) -> str:
    """The end of a child's log (the temp folder holding it is gone once the run fails)."""
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def gateway_argv(mode: str, port: int, upstreams: Sequence[str], store_url: str) -> list[str]:
    argv = [str(FOLDGATE), "serve", "--port", str(port)]
    argv += [arg for url in upstreams for arg in ("--replica", url)]
    argv += ["--store", store_url]
    return [*argv, "--ray"] if mode == "ray" else argv


def gateway_env(mode: str, tmp: Path) -> dict[str, str]:
    if mode != "ray":
        return {}
    # Short: Ray's unix socket paths below this folder must stay under 108 bytes.
    ray_tmp = tmp / "r"
    ray_tmp.mkdir(exist_ok=True)
    haproxy_stats, haproxy_metrics = free_ports(2)
    return {
        **fast_path_env(haproxy_ports=(haproxy_stats, haproxy_metrics)),
        "RAY_TMPDIR": str(ray_tmp),
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "1",
    }


async def replay_session(http: aiohttp.ClientSession, url: str, bodies: Sequence[bytes]) -> None:
    """``bodies`` posted to ``url`` one after another as one new session (a fresh id)."""
    headers = {"content-type": "application/json", "x-session-id": str(uuid.uuid4())}
    for body in bodies:
        await post(http, url, body, headers)


async def post(http: aiohttp.ClientSession, url: str, body: bytes, headers: dict) -> float:
    started = time.perf_counter()
    async with http.post(url, data=body, headers=headers) as resp:
        reply = await resp.read()
        if resp.status != 200:
            # The reply's start says why (a gateway's error names the replica's failure).
            raise RuntimeError(
                f"{url} answered {resp.status}: {reply[:300].decode(errors='replace')}"
            )
    return time.perf_counter() - started
