"""The argument checks the contracts' public methods make once, before any backend runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

MAX_ID_LEN = 512


def check_id(kind: str, value: object) -> str:
    """A tenant, session, reply, replica, token or counter name: a short string without NUL."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{kind} must be a non-empty string, got {value!r}")
    if len(value) > MAX_ID_LEN:
        raise ValueError(f"{kind} is {len(value)} characters long; the limit is {MAX_ID_LEN}")
    if "\x00" in value:
        raise ValueError(f"{kind} must not contain NUL characters")
    return value


def check_branch(branch: object) -> int:
    if not isinstance(branch, int) or isinstance(branch, bool) or branch < 0:
        raise ValueError(f"branch id must be a non-negative int, got {branch!r}")
    return branch


def check_turns(after_index: object, messages: Sequence[Mapping[str, Any]]) -> None:
    if not isinstance(after_index, int) or isinstance(after_index, bool) or after_index < 0:
        raise ValueError(f"after_index must be a non-negative int, got {after_index!r}")
    if not messages:
        raise ValueError("append_gateway_turns needs at least one message")


def check_counts(counts: Mapping[str, int], token: str, latest: Mapping[str, int]) -> None:
    for name, value in (*counts.items(), *latest.items()):
        check_id("counter name", name)
        if ":" in name or "@" in name:
            raise ValueError(f"counter name {name!r} must not contain ':' or '@'")
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"counter {name!r} must be an int, got {value!r}")
    check_id("count token", token)


def check_ttl(what: str, ttl_s: float) -> None:
    if ttl_s <= 0:
        raise ValueError(f"{what} ttl_s must be positive, got {ttl_s}")


def check_lease_period(period_s: float) -> None:
    if not period_s > 0:
        raise ValueError(f"lease period_s must be positive, got {period_s}")
