"""Where a cell's prefix hit went, from the Locust request log alone.

Each request after a session's first could have been served from cache up to its session's
previous prompt, in whole KV blocks (vLLM caches full blocks only), where this prompt is at
least that long: that is its reusable prefix. What the reply's ``usage`` says was cached
falls short of it by the tokens lost, put down to one cause each:

- **moved**: the request ran on another replica than the session's previous one (known only
  where the front names the replica, foldgate's ``x-foldgate-replica``);
- **after a wait**: the gateway held the request at admission first (its
  ``x-foldgate-admission-wait`` above zero): the session was outside its replica's working
  set and its blocks went while it waited, or before;
- **other**: evicted during the pause with no wait, or the prompt rewritten (a ReFold chunk
  boundary, a chat template that drops older reasoning) so that it no longer extends the
  previous one.

The reusable share is the hit these prompts would have with nothing ever evicted, counting
only what a session's own previous request leaves (sessions that share a prefix with each
other, one harness's system prompt or a recording replayed twice at once, can hit more);
shares are of all prompt tokens, so the client-side hit plus the losses is the reusable
share, less what came from other sessions. A request that lost more than half of its
reusable prefix is a re-prefill."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# An admission wait under this is the gateway's own bookkeeping, not a held request.
HELD_S = 0.01


@dataclass(frozen=True)
class PrefixLosses:
    """Shares of all prompt tokens, and re-prefills per session that made a second step;
    the field names are the result row's columns (``asdict``)."""

    prefix_reusable: float
    prefix_lost_moved: float
    prefix_lost_after_wait: float
    prefix_lost_other: float
    reprefills_per_session: float


def prefix_losses(requests: Iterable[Mapping[str, Any]], block_size: int) -> PrefixLosses:
    """The losses of the requests that streamed to the end, in start order per session."""
    if block_size <= 0:
        raise ValueError(f"block size must be positive, got {block_size}")
    done = sorted(
        (r for r in requests if r["ok"] and r.get("prompt_tokens")), key=lambda r: r["start"]
    )
    total = reusable = moved = waited = other = 0
    reprefills: dict[str, int] = {}
    previous: dict[str, Mapping[str, Any]] = {}
    for r in done:
        prompt = r["prompt_tokens"]
        total += prompt
        before = previous.get(r["session"])
        previous[r["session"]] = r
        if before is None:
            continue
        could = min(before["prompt_tokens"], prompt) // block_size * block_size
        lost = max(could - (r.get("cached_tokens") or 0), 0)
        reusable += could
        if before.get("replica") and r.get("replica") and before["replica"] != r["replica"]:
            moved += lost
        elif (r.get("admission_wait_s") or 0.0) > HELD_S:
            waited += lost
        else:
            other += lost
        count = reprefills.setdefault(r["session"], 0)
        reprefills[r["session"]] = count + (2 * lost > could > 0)
    if not total:
        return PrefixLosses(0.0, 0.0, 0.0, 0.0, 0.0)
    return PrefixLosses(
        prefix_reusable=reusable / total,
        prefix_lost_moved=moved / total,
        prefix_lost_after_wait=waited / total,
        prefix_lost_other=other / total,
        reprefills_per_session=sum(reprefills.values()) / len(reprefills) if reprefills else 0.0,
    )
