"""What a rewrite of already-sent context is worth: ReFold's rule for when to fold.

A replica keeps the session's previous prompt in its prefix cache. Rewriting that prompt
(folding steps the model already read) invalidates every cached token after the first
changed one, so they are prefilled again: that is the cost, paid once, in prefill tokens.
What the rewrite buys is a shorter context on every later request of the session: fewer
tokens held in the KV pool and attended to while decoding. A cached token is not free, but
it is much cheaper than a prefilled one; providers that bill prompt caching charge cached
input at about a tenth of fresh input (Anthropic 0.1x, OpenAI 0.1-0.5x), which is the
weight used here when the replica has KV to spare.

Under KV pressure a token held is worth more: it is what keeps other sessions' prefixes
from being evicted and requests from queueing or being preempted (each of which costs a
whole prefill again). vLLM reports ``kv_cache_usage_perc`` (blocks held by running
requests; cached but unreferenced blocks count as free); from ``PRESSURE_KNEE`` on the
weight of a removed token rises linearly to that of a prefilled one at a full pool.

How many more requests will read the shorter context is unknown; a session that has made
``n`` requests is expected to make about ``n`` more (the median remaining lifetime of a
process with a heavy-tailed length, as agent sessions are: they stop when the task does,
and a long-running one is evidence of a long task). The rule is pure: the same inputs give
the same decision.
"""

from __future__ import annotations

CACHED_TOKEN_WEIGHT = 0.1
PRESSURE_KNEE = 0.5


def token_weight(pressure: float) -> float:
    """What one token less in the context saves per request, in prefill-token units."""
    p = min(max(float(pressure), 0.0), 1.0)
    ramp = max(0.0, (p - PRESSURE_KNEE) / (1.0 - PRESSURE_KNEE))
    return CACHED_TOKEN_WEIGHT + (1.0 - CACHED_TOKEN_WEIGHT) * ramp


def expected_remaining_requests(requests_so_far: int) -> int:
    """Requests the session is still expected to make (at least one: the current one)."""
    return max(1, requests_so_far)


def rewrite_value(saved_tokens: int, requests_so_far: int, pressure: float) -> float:
    """Prefill tokens a rewrite that removes ``saved_tokens`` is expected to save."""
    return saved_tokens * expected_remaining_requests(requests_so_far) * token_weight(pressure)


def rewrite_pays(
    saved_tokens: int, reprefill_tokens: int, requests_so_far: int, pressure: float
) -> bool:
    """True when removing ``saved_tokens`` is worth prefilling ``reprefill_tokens`` again."""
    if saved_tokens <= 0:
        return False
    return rewrite_value(saved_tokens, requests_so_far, pressure) > reprefill_tokens
