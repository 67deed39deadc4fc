"""``foldgate serve`` raises its soft open-file limit toward what its bounds can use, and
logs failed accepts past it a line at a time."""

from __future__ import annotations

import asyncio
import logging
import resource
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
