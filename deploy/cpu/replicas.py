"""Start and stop real vLLM-CPU replicas of the tiny model, for tests and experiments.

Runs with the gateway's Python and never imports vllm: each replica is a
``.vllm-venv/bin/python -m vllm.entrypoints.openai.api_server`` subprocess (the ``vllm``
console script of vllm-cpu is broken) pinned to one core, with a private TMPDIR (vLLM writes
~150 MB of torchinductor cache there) that is deleted when the replica stops.

    with start_replicas(2) as replicas:
        urls = [r.url for r in replicas]

CLI (pid files under ``.foldgate/run/``, logs under ``.foldgate/logs/``)::

    python -m deploy.cpu.replicas start -n 2 [--base-port 8100] [--kv-cache-bytes 256M]
    python -m deploy.cpu.replicas status
    python -m deploy.cpu.replicas stop
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from deploy.cpu.processes import tree_rss_bytes, wait_exit
from deploy.cpu.vllm_server import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_KV_CACHE_BYTES,
    DEFAULT_MODEL_DIR,
    DEFAULT_PYTHON,
    HOST,
    INSTALL_HINT,
    KV_EVENTS_ENV,
    KV_EVENTS_PORT_OFFSET,
    ROOT,
    is_ready,
    kv_events_args,
    log_tail,
    parse_bytes,
    server_command,
    server_env,
)

RUN_DIR = ROOT / ".foldgate" / "run"
LOG_DIR = ROOT / ".foldgate" / "logs"


class ReplicaError(RuntimeError):
    """A replica could not be started, or did not become ready."""


@dataclass(frozen=True, slots=True)
class Replica:
    url: str
    port: int
    pid: int
    log_path: Path
    core: int
    tmpdir: Path

    def to_json(self) -> dict[str, object]:
        return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Replica:
        try:
            return cls(
                url=str(data["url"]),
                port=int(data["port"]),  # type: ignore[call-overload]
                pid=int(data["pid"]),  # type: ignore[call-overload]
                log_path=Path(str(data["log_path"])),
                core=int(data["core"]),  # type: ignore[call-overload]
                tmpdir=Path(str(data["tmpdir"])),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a replica record: {data!r} ({exc})") from exc


def free_ports(n: int, *, offset: int | None = None) -> list[int]:
    """``n`` distinct ports that were free a moment ago (all held open while choosing); with
    ``offset``, each one's ``port + offset`` too (a replica's KV-events port: the kernel
    hands out these ports to outgoing connections as well, where a listening check does not
    see them, and vLLM's publisher then fails to bind)."""
    with contextlib.ExitStack() as stack:
        chosen: list[int] = []
        while len(chosen) < n:
            s = stack.enter_context(socket.socket())
            s.bind((HOST, 0))
            port = s.getsockname()[1]
            if offset is not None:
                partner = stack.enter_context(socket.socket())
                try:
                    partner.bind(("0.0.0.0", port + offset))  # where vLLM binds it: every address
                except (OSError, OverflowError):
                    continue  # in use, or past the last port: the held one is not reused
            chosen.append(port)
        return chosen


def _port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((HOST, port)) == 0


def available_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def is_vllm_server(replica: Replica) -> bool:
    """The pid still runs the API server on ``replica.port`` (and not a recycled pid)."""
    try:
        cmdline = Path(f"/proc/{replica.pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    server = b"vllm.entrypoints.openai.api_server"
    return server in cmdline and str(replica.port).encode() in cmdline


def _signal(replica: Replica, sig: signal.Signals, group: bool = False) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        (os.killpg if group else os.kill)(replica.pid, sig)


def stop_replica(
    replica: Replica,
    proc: subprocess.Popen[bytes] | None = None,
    grace_s: float = 15.0,
    terminated: bool = False,
) -> None:
    """SIGTERM the API server (it ends its engine), SIGKILL its process group if it lingers,
    delete its TMPDIR. Without ``proc`` (a pid file), only a pid that still runs this
    replica's server is signalled. ``terminated``: SIGTERM was already sent."""
    if proc is None and not is_vllm_server(replica):
        shutil.rmtree(replica.tmpdir, ignore_errors=True)
        return
    if not terminated:
        _signal(replica, signal.SIGTERM)
    if not wait_exit(replica.pid, proc, grace_s):
        _signal(replica, signal.SIGKILL, group=True)
        wait_exit(replica.pid, proc, 5.0)
    # Engine processes left behind by a killed server share its process group.
    _signal(replica, signal.SIGKILL, group=True)
    shutil.rmtree(replica.tmpdir, ignore_errors=True)


@dataclass
class ReplicaSet:
    """Replicas started by this process; a context manager that stops them on exit."""

    replicas: list[Replica] = field(default_factory=list)
    _procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)

    def __iter__(self) -> Iterator[Replica]:
        return iter(self.replicas)

    def __len__(self) -> int:
        return len(self.replicas)

    def __getitem__(self, i: int) -> Replica:
        return self.replicas[i]

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self.replicas]

    def __enter__(self) -> ReplicaSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        # Terminate all first so that the shutdowns overlap.
        for replica in self.replicas:
            _signal(replica, signal.SIGTERM)
        for replica in self.replicas:
            stop_replica(replica, self._procs.get(replica.pid), terminated=True)
        self.replicas.clear()
        self._procs.clear()


def _check_inputs(
    n: int, ports: Sequence[int], python: Path, model_dir: Path, kv_events: bool = False
) -> None:
    if n < 1:
        raise ValueError(f"need at least one replica, got n={n}")
    if len(ports) != n or len(set(ports)) != n:
        raise ValueError(f"need {n} distinct ports, got {list(ports)}")
    if not python.is_file():
        raise ReplicaError(f"no vLLM Python at {python}: {INSTALL_HINT}")
    if not (model_dir / "config.json").is_file():
        raise ReplicaError(f"no model at {model_dir} (config.json missing): {INSTALL_HINT}")
    wanted = [*ports, *(p + KV_EVENTS_PORT_OFFSET for p in ports if kv_events)]
    busy = [p for p in wanted if _port_in_use(p)]
    if busy:
        raise ReplicaError(f"ports already in use: {busy}")


def start_replicas(
    n: int,
    *,
    base_port: int = 8100,
    ports: Sequence[int] | None = None,
    model_dir: Path = DEFAULT_MODEL_DIR,
    served_name: str = "tiny",
    kv_cache_bytes: int | str = DEFAULT_KV_CACHE_BYTES,
    max_model_len: int = 32_768,
    block_size: int = DEFAULT_BLOCK_SIZE,
    cores: Sequence[int] | None = None,
    python: Path = DEFAULT_PYTHON,
    log_dir: Path = LOG_DIR,
    ready_timeout_s: float = 300.0,
    extra_args: Sequence[str] = (),
    extra_env: Mapping[str, str] | None = None,
    kv_events: bool = False,
) -> ReplicaSet:
    """Start ``n`` replicas (ports ``base_port..`` unless ``ports``), one core each, and wait
    until all answer ``/health`` and ``/v1/models``. ``extra_env`` adds variables to each
    server's environment (e.g. ``VLLM_SERVER_DEV_MODE=1`` for ``/reset_prefix_cache``).
    ``kv_events``: each publishes its KV events on its port + ``KV_EVENTS_PORT_OFFSET``
    (``vllm_server.kv_events_args``). On failure every one is stopped and a
    ``ReplicaError`` carries the failing replica's log tail."""
    ports = list(ports) if ports is not None else [base_port + i for i in range(n)]
    model_dir = model_dir.resolve()
    _check_inputs(n, ports, python, model_dir, kv_events)
    kv_bytes = parse_bytes(kv_cache_bytes)
    cores = list(cores) if cores is not None else available_cores()
    log_dir.mkdir(parents=True, exist_ok=True)
    started = ReplicaSet()
    try:
        for i, port in enumerate(ports):
            core = cores[i % len(cores)]
            tmpdir = Path(tempfile.mkdtemp(prefix=f"foldgate-vllm-{port}-"))
            log_path = log_dir / f"vllm-{port}.log"
            events = kv_events_args(port) if kv_events else []
            cmd = server_command(
                python, model_dir, served_name, port, kv_bytes, max_model_len, block_size,
                [*extra_args, *events],
            )  # fmt: skip
            env = {**server_env(core, tmpdir), **(KV_EVENTS_ENV if kv_events else {})}
            with log_path.open("wb") as log:
                proc = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**env, **(extra_env or {})},
                    cwd=tmpdir,
                    # Own process group: stop() can kill the engine children with the server.
                    start_new_session=True,
                )
            replica = Replica(f"http://{HOST}:{port}", port, proc.pid, log_path, core, tmpdir)
            started.replicas.append(replica)
            started._procs[proc.pid] = proc
        _wait_ready(started, ready_timeout_s)
    except BaseException:
        started.stop()
        raise
    return started


def _wait_ready(replicas: ReplicaSet, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    pending = list(replicas)
    while pending:
        for replica in list(pending):
            code = replicas._procs[replica.pid].poll()
            if code is not None:
                raise ReplicaError(
                    f"vLLM replica on port {replica.port} exited with code {code} before it was"
                    f" ready; log {replica.log_path}:\n{log_tail(replica.log_path)}"
                )
            if is_ready(replica.url):
                pending.remove(replica)
        if pending and time.monotonic() > deadline:
            r = pending[0]
            raise ReplicaError(
                f"vLLM replica on port {r.port} not ready after {timeout_s:.0f} s;"
                f" log {r.log_path}:\n{log_tail(r.log_path)}"
            )
        if pending:
            time.sleep(0.5)


# ---- CLI: replicas that outlive the command, tracked by pid files ----


def _pid_files(run_dir: Path) -> list[Path]:
    return sorted(run_dir.glob("replica-*.json"))


def _load(run_dir: Path) -> list[tuple[Path, Replica]]:
    return [(p, Replica.from_json(json.loads(p.read_text()))) for p in _pid_files(run_dir)]


def cli_start(args: argparse.Namespace) -> int:
    if _pid_files(args.run_dir):
        print(f"replicas already recorded in {args.run_dir}; run `stop` first", file=sys.stderr)
        return 1
    replicas = start_replicas(
        args.n,
        base_port=args.base_port,
        model_dir=args.model_dir,
        served_name=args.served_name,
        kv_cache_bytes=args.kv_cache_bytes,
        max_model_len=args.max_model_len,
        ready_timeout_s=args.timeout,
    )
    args.run_dir.mkdir(parents=True, exist_ok=True)
    for r in replicas:
        (args.run_dir / f"replica-{r.port}.json").write_text(json.dumps(r.to_json()))
        print(f"{r.url}  pid {r.pid}  core {r.core}  log {r.log_path}")
    return 0


def cli_stop(args: argparse.Namespace) -> int:
    for path, replica in _load(args.run_dir):
        stop_replica(replica)
        path.unlink()
        print(f"stopped {replica.url} (pid {replica.pid})")
    return 0


def cli_status(args: argparse.Namespace) -> int:
    records = _load(args.run_dir)
    if not records:
        print(f"no replicas recorded in {args.run_dir}")
    for _, r in records:
        alive = is_vllm_server(r)
        state = ("ready" if is_ready(r.url) else "starting/unhealthy") if alive else "dead"
        rss = f"{tree_rss_bytes(r.pid) / 2**30:.2f} GiB" if alive else "-"
        print(f"{r.url}  pid {r.pid}  core {r.core}  {state}  rss {rss}  log {r.log_path}")
    return 0 if all(is_vllm_server(r) for _, r in records) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.cpu.replicas", description=__doc__)
    parser.add_argument("--run-dir", type=Path, default=RUN_DIR, help="where pid files live")
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="start replicas and wait until they are ready")
    start.add_argument("-n", type=int, default=2, help="number of replicas (one core each)")
    start.add_argument("--base-port", type=int, default=8100)
    start.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    start.add_argument("--served-name", default="tiny")
    start.add_argument("--kv-cache-bytes", type=parse_bytes, default=DEFAULT_KV_CACHE_BYTES)
    start.add_argument("--max-model-len", type=int, default=32_768)
    start.add_argument("--timeout", type=float, default=300.0, help="readiness timeout, s")
    sub.add_parser("stop", help="stop the recorded replicas")
    sub.add_parser("status", help="show the recorded replicas")
    args = parser.parse_args(argv)
    handlers = {"start": cli_start, "stop": cli_stop, "status": cli_status}
    try:
        return handlers[args.command](args)
    except (ReplicaError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
