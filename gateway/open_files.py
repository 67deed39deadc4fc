"""The serving process's open-file limit, raised at start toward what its bounds can use.

Every socket is a file descriptor: a request in flight holds its client's connection and
one to a replica; up to ``header_connections_total`` more wait for their headers or idle
between requests; the upstream pool keeps idle connections to the replicas; the store,
the log and the interpreter hold a few dozen. Many systems start a process at a soft
limit of 1,024, which ``max_concurrency`` (1,024 by default) alone passes: an accept past
it fails with EMFILE, and uvicorn's listener stops taking connections. The hard limit is
the system's to set; the soft one the process may raise to it.
"""

from __future__ import annotations

import resource

from gateway.config import GatewayConfig

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
