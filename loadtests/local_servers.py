"""Throwaway local servers for tests and benchmarks: a ``redis-server`` process on a free
port, and the gateway itself served by uvicorn in this process.

They live here rather than in ``tests/`` because the benchmarks use them too, and nothing
outside the tests imports ``tests``.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import uvicorn

from deploy.cpu.replicas import free_ports
from gateway.app import create_app
from gateway.config import GatewayConfig
from gateway.http_server import uvicorn_config


@asynccontextmanager
async def running_gateway(config: GatewayConfig) -> AsyncIterator[str]:
    """Serve ``create_app(config)`` with uvicorn until the block exits; yields its base URL."""
    (port,) = free_ports(1)
    server = uvicorn.Server(uvicorn_config(create_app(config), config, "127.0.0.1", port))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


class RedisServer:
    """Starts ``redis-server`` with a private data dir; restartable on the same data."""

    def __init__(self, data_dir: Path, *extra: str, port: int | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.binary = binary
        self.data_dir = data_dir
        self.port = port or free_ports(1)[0]
        self.extra = extra or ("--save", "", "--appendonly", "no")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--dir", str(self.data_dir), *self.extra]
        self.proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: {args}")
            if self._ping():
                return
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server on port {self.port} did not answer within {timeout_s}s")

    def _ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL: no shutdown save, no goodbye to clients, like a crashed host."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        self._signal(signal.SIGTERM)

    def _signal(self, sig: signal.Signals) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=10)
        self.proc = None
