"""``foldgate serve`` raises its soft open-file limit toward what its bounds can use, and
logs failed accepts past it a line at a time."""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import socket
from collections.abc import Iterator

import pytest
import uvicorn
from click.testing import CliRunner

from gateway import gc_tuning
from gateway.cli import main
from gateway.config import GatewayConfig
from gateway.open_files import ACCEPT_ERROR, AcceptErrorLog, needed_descriptors, soft_limit

INFINITY = resource.RLIM_INFINITY


def test_the_soft_limit_rises_to_the_need_within_the_hard_limit() -> None:
    assert soft_limit(1024, 65_536, 2_816) == 2_816
    assert soft_limit(1024, 2_000, 2_816) == 2_000  # the hard limit is the system's
    assert soft_limit(1024, INFINITY, 2_816) == 2_816
    assert soft_limit(8_192, 65_536, 2_816) == 8_192  # never lowered
    assert soft_limit(INFINITY, INFINITY, 2_816) == INFINITY


def test_the_need_counts_both_sockets_of_each_request_and_the_waiting_connections() -> None:
    small = GatewayConfig(max_concurrency=10, header_connections_total=20)
    larger = GatewayConfig(max_concurrency=11, header_connections_total=21)
    assert needed_descriptors(larger) - needed_descriptors(small) == 2 + 1
    assert needed_descriptors(GatewayConfig()) > 2 * 1024 + 512


@pytest.fixture
def low_soft_limit() -> Iterator[int]:
    """The process's soft limit at 1,024 (a common default), restored afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != INFINITY and hard <= 1024:
        pytest.fail(f"the test needs a hard open-file limit above 1024, got {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    try:
        yield hard
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_serve_raises_the_soft_limit_before_it_serves(
    low_soft_limit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[int] = []
    monkeypatch.setattr(gc_tuning, "tune_for_serving", lambda: None)  # this test process's gc
    monkeypatch.setattr(
        uvicorn.Server,
        "run",
        lambda self: seen.append(resource.getrlimit(resource.RLIMIT_NOFILE)[0]),
    )
    result = CliRunner().invoke(main, ["serve", "--replica", "http://127.0.0.1:9"])
    assert result.exit_code == 0, result.output
    needed = needed_descriptors(GatewayConfig())
    expected = soft_limit(1024, low_soft_limit, needed)
    assert seen == [expected] and expected > 1024
    assert f"open files: soft limit 1024 -> {expected}" in result.output


def test_failed_accepts_are_one_line_per_interval_and_other_errors_pass_on(caplog) -> None:
    now = [0.0]
    passed_on: list[dict] = []
    handler = AcceptErrorLog(lambda loop, ctx: passed_on.append(ctx), 10.0, lambda: now[0])
    loop = asyncio.new_event_loop()
    try:
        failed = {"message": ACCEPT_ERROR, "exception": OSError(24, "Too many open files")}
        with caplog.at_level(logging.ERROR, logger="foldgate"):
            for _ in range(2048):  # one wake-up of the listener at uvicorn's backlog
                handler(loop, failed)
            now[0] = 9.9
            handler(loop, failed)
            assert len(caplog.records) == 1 and "failed 1 time(s)" in caplog.messages[0]
            now[0] = 10.0
            handler(loop, failed)
            assert len(caplog.records) == 2 and "failed 2049 time(s)" in caplog.messages[1]
        other = {"message": "Task exception was never retrieved"}
        handler(loop, other)
        assert passed_on == [other]
    finally:
        loop.close()


async def test_a_listener_closed_after_failed_accepts_logs_lines_not_a_traceback_each(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Connections queued past the open-file limit make every accept fail, and each failure
    schedules a retry; the listener closing before the retries run (the process stopping)
    made each of them a traceback. A real listener, real queued connections."""
    loop = asyncio.get_running_loop()
    AcceptErrorLog.install(loop)
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0, backlog=64)
    port = server.sockets[0].getsockname()[1]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    queued: list[socket.socket] = []
    retries_ran = asyncio.Event()
    try:
        for _ in range(32):  # the kernel completes these into the listen queue, unaccepted
            client = socket.socket()
            client.setblocking(False)
            client.connect_ex(("127.0.0.1", port))
            queued.append(client)
        with caplog.at_level(logging.WARNING, logger="foldgate"):
            # No descriptor left for an accept: the process holds all it may.
            resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")), hard))
            while not caplog.records:
                await asyncio.sleep(0.01)  # the loop's turn to accept, and fail
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            server.close()  # before the retries, due a second after each failure, run
            loop.call_later(1.5, retries_ran.set)
            await retries_ran.wait()
        messages = [r.getMessage() for r in caplog.records]
        assert len(messages) == 2, messages
        assert "accepting connections failed" in messages[0]
        assert "found the listener closed" in messages[1]
        assert not any(r.exc_info for r in caplog.records)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        for client in queued:
            client.close()
        await server.wait_closed()
