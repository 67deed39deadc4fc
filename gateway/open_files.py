"""The serving process's open-file limit, raised at start toward what its bounds can use.

Every socket is a file descriptor: a request in flight holds its client's connection and
one to a replica; up to ``header_connections_total`` more wait for their headers or idle
between requests; the upstream pool keeps idle connections to the replicas; the store,
the log and the interpreter hold a few dozen. Many systems start a process at a soft
limit of 1,024, which ``max_concurrency`` (1,024 by default) alone passes: an accept past
it fails with EMFILE, and uvicorn's listener stops taking connections. The hard limit is
the system's to set; the soft one the process may raise to it.

Past the limit anyway (a lower hard limit, a flood of connections accepted faster than the
header phase closes them), every failed accept is an asyncio error with a traceback, and
Python's selector loop before gh-151615 retries up to the listen backlog (2,048 in uvicorn)
times per wake-up: a flood of connections wrote megabytes of log a second. Each of those
failed accepts also schedules a retry a second later; when the listener closes before
they run (the process stopping), every one of them fails again on the closed socket,
another traceback each. ``AcceptErrorLog`` collapses both into a line per interval.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections.abc import Callable
from typing import Any

from gateway.config import GatewayConfig

log = logging.getLogger("foldgate")
# The message asyncio's selector loop reports a failed accept with (EMFILE, ENFILE, ...).
ACCEPT_ERROR = "socket.accept() out of system resource"
# How the loop reports one of those retries failing (the listener closed meanwhile).
ACCEPT_RETRY_ERROR = "Exception in callback BaseSelectorEventLoop._start_serving("

# Descriptors besides the connections: the store, the log, the interpreter's own, the
# upstream pool's idle connections, probes and KV event subscriptions.
BASE_DESCRIPTORS = 256


def needed_descriptors(config: GatewayConfig) -> int:
    """Descriptors the gateway can hold at once within its configured bounds."""
    return 2 * config.max_concurrency + config.header_connections_total + BASE_DESCRIPTORS


def soft_limit(soft: int, hard: int, needed: int) -> int:
    """The soft limit to set: ``needed``, within ``hard``; never below ``soft``."""
    if soft == resource.RLIM_INFINITY:
        return soft
    if hard == resource.RLIM_INFINITY:
        return max(soft, needed)
    return max(soft, min(hard, needed))


def raise_open_files(needed: int) -> tuple[int, int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` toward ``needed`` (within the hard limit): the soft
    limit before, after, and the hard limit."""
    before, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    after = soft_limit(before, hard, needed)
    if after != before:
        resource.setrlimit(resource.RLIMIT_NOFILE, (after, hard))
    return before, after, hard


def open_files_line(config: GatewayConfig) -> str:
    """Raise the limit for ``config``; what to log about it."""
    needed = needed_descriptors(config)
    before, after, hard = raise_open_files(needed)
    line = f"open files: soft limit {before} -> {after} (hard {hard}, bounds need {needed})"
    if after < needed:
        line += (
            "; the hard limit is below what max_concurrency and header_connections_total "
            "can use: raise it (ulimit -Hn), or lower them"
        )
    return line


class AcceptErrorLog:
    """An event loop exception handler: failed accepts (out of descriptors or memory), and
    their retries that find the listener closed, are logged at most once per
    ``interval_s`` each, with how many failed since the last line; every other error goes
    to the handler before it (or the loop's default)."""

    def __init__(
        self,
        previous: Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object] | None = None,
        interval_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.previous = previous
        self.interval_s = interval_s
        self.clock = clock
        self.failed = 0  # accepts, since the last line about them
        self.retries_failed = 0  # retries on a closed listener, since the last line
        self._next_line_at = float("-inf")
        self._next_retry_line_at = float("-inf")

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = context.get("message", "")
        if message == ACCEPT_ERROR:
            self._failed_accept(context)
        elif message.startswith(ACCEPT_RETRY_ERROR):
            self._failed_retry(context)
        elif self.previous is not None:
            self.previous(loop, context)
        else:
            loop.default_exception_handler(context)

    def _failed_accept(self, context: dict[str, Any]) -> None:
        self.failed += 1
        now = self.clock()
        if now < self._next_line_at:
            return
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        log.error(
            "accepting connections failed %d time(s) (%s; open files soft limit %s): "
            "connections wait in the listen queue; raise the limit (ulimit -n) or lower "
            "max_concurrency and header_connections_total",
            self.failed,
            context.get("exception"),
            limit,
        )
        self.failed = 0
        self._next_line_at = now + self.interval_s

    def _failed_retry(self, context: dict[str, Any]) -> None:
        self.retries_failed += 1
        now = self.clock()
        if now < self._next_retry_line_at:
            return
        log.warning(
            "%d retry(ies) of failed accepts found the listener closed (%s)",
            self.retries_failed,
            context.get("exception"),
        )
        self.retries_failed = 0
        self._next_retry_line_at = now + self.interval_s

    @classmethod
    def install(cls, loop: asyncio.AbstractEventLoop) -> AcceptErrorLog:
        handler = cls(loop.get_exception_handler())
        loop.set_exception_handler(handler)
        return handler
