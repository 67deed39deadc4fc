"""The serving path around the engine, fitted from the requests a Locust run logged.

``fit_serving_path``: the two serving-path terms (per streamed token, per request) on top
of the engine terms: each request's decode stretch and time to first token, less what the
engine terms predict for the steps its replica ran meanwhile, is what the serving path
around the engine cost. ``token_interval``: where that per-token work lands (on the
request's replica, or shared by the whole machine).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from router.cost import CostModel


@dataclass(frozen=True, slots=True)
class ServedRequest:
    """One request as a Locust user logged it: when it was sent, got its first token and
    ended (seconds), on which replica, and its token counts."""

    replica: str
    start: float
    first_token: float
    end: float
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int

    @classmethod
    def from_log(cls, record: dict[str, Any]) -> ServedRequest | None:
        """A ``requests.jsonl`` record, or None when it cannot be placed (failed, no
        replica, no token times)."""
        if not record.get("ok") or not record.get("replica") or record.get("ttft_ms") is None:
            return None
        start = float(record["start"])
        return cls(
            replica=record["replica"],
            start=start,
            first_token=start + record["ttft_ms"] / 1e3,
            end=start + record["ttlt_ms"] / 1e3,
            prompt_tokens=int(record["prompt_tokens"] or 0),
            cached_tokens=int(record["cached_tokens"] or 0),
            output_tokens=int(record["completion_tokens"] or 0),
        )

    @property
    def uncached(self) -> int:
        return self.prompt_tokens - self.cached_tokens


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


@dataclass(frozen=True, slots=True)
class ServingPathFit:
    per_output_token_s: float
    per_request_s: float
    step_jitter: float  # log-space spread of decode stretches around the fitted model
    requests: int


def fit_serving_path(requests: Sequence[ServedRequest], engine: CostModel) -> ServingPathFit:
    """The serving-path terms and the step jitter from requests served by replicas that
    ``engine``'s engine terms describe (requests of one replica must come from one run).

    Decode: a request's n tokens after the first took n - 1 engine steps; in each, every
    other request decoding on its replica then emitted a token too. The stretch's duration
    less the engine terms' prediction for those steps (and for other requests' prefills
    that completed inside it) is regressed on the tokens emitted, through the origin.
    First token: what is left of the time to first token after the request's prefill
    steps (carrying the decodes running beside it) and, when others decode, half a step
    already in progress is
    the per-request latency; the median over requests, so a request that queued behind a
    long prefill does not count.
    Jitter: each decode stretch over what the fitted terms predict for it, in logs; their
    spread (interquartile range / 1.349, the standard deviation of a normal with that
    range, so the few stretches a long prefill stalled do not count) is ``step_jitter``.
    """
    by_replica: dict[str, list[ServedRequest]] = {}
    for r in requests:
        by_replica.setdefault(r.replica, []).append(r)
    stretches = [s for served in by_replica.values() for s in _decode_stretches(served, engine)]
    if not stretches:
        raise ValueError("no request with a decode stretch to fit")
    x = np.asarray([emitted for emitted, _, _ in stretches])
    y = np.asarray([residual for _, residual, _ in stretches])
    spans = np.asarray([span for _, _, span in stretches])
    per_token = max(0.0, float(x @ y / (x @ x)))
    # The fitted model's prediction of each stretch is span - residual + per_token * emitted.
    model = spans - y + per_token * x
    ratios = np.log(spans[model > 0] / model[model > 0])
    q1, q3 = np.percentile(ratios, [25, 75])
    jitter = float(q3 - q1) / 1.349
    firsts = [f for served in by_replica.values() for f in _lone_first_tokens(served)]
    left = [
        _first_token_left(r, beside, context, engine, per_token) for r, beside, context in firsts
    ]
    return ServingPathFit(per_token, max(0.0, float(np.median(left))), jitter, len(requests))


def _lone_first_tokens(served: list[ServedRequest]) -> list[tuple[ServedRequest, int, int]]:
    """The requests of one replica whose first token waited on no other's, each with how
    many requests were decoding when it was sent and their prompt tokens (the steps its
    prefill shares)."""
    firsts = []
    for r in served:
        others = [o for o in served if o is not r]
        beside = sum(1 for o in others if o.first_token <= r.start < o.end)
        context = sum(o.prompt_tokens for o in others if o.first_token <= r.start < o.end)
        # A request sent while another on its replica still waited for its first token
        # may queue behind it (for the budget or for KV): its latency is not only the
        # serving path's.
        if not any(o.start < r.start < o.first_token for o in others):
            firsts.append((r, beside, context))
    return firsts


def _decode_stretches(
    served: list[ServedRequest], engine: CostModel
) -> list[tuple[float, float, float]]:
    """Per request of one replica with a decode stretch: (tokens emitted on the replica
    meanwhile, the stretch less the engine terms' prediction, the stretch)."""
    stretches = []
    for r in served:
        others = [o for o in served if o is not r]
        steps = r.output_tokens - 1
        span = r.end - r.first_token
        if steps < 2 or span <= 0:
            continue
        # Each other decoder's share of this stretch, and prefills finished inside it.
        shares = [(o, _overlap(r.first_token, r.end, o.first_token, o.end) / span) for o in others]
        emitted = steps * (1 + sum(f for _, f in shares))
        attended = steps * (
            r.prompt_tokens
            + r.output_tokens / 2
            + sum(f * (o.prompt_tokens + o.output_tokens / 2) for o, f in shares)
        )
        prefill = sum(o.uncached for o in others if r.first_token < o.first_token <= r.end)
        predicted = (
            steps * engine.per_step_s
            + prefill * engine.per_prefill_token_s
            + emitted * engine.per_decode_seq_s
            + attended * engine.per_attended_token_s
        )
        stretches.append((emitted, span - predicted, span))
    return stretches


def _first_token_left(
    r: ServedRequest, beside: int, context: int, engine: CostModel, per_token: float
) -> float:
    """What a request's time to first token leaves past its prefill steps (carrying the
    ``beside`` decodes of ``context`` tokens) and half a step in progress."""
    chunks = max(1, math.ceil(r.uncached / engine.max_num_batched_tokens))
    decode_step = (
        engine.per_step_s
        + beside * (engine.per_decode_seq_s + per_token)
        + context * engine.per_attended_token_s
    )
    prefill = (
        chunks * decode_step
        + r.uncached * engine.per_prefill_token_s
        + r.prompt_tokens * engine.per_attended_token_s
    )
    in_progress = decode_step / 2 if beside else 0.0
    return r.first_token - r.start - prefill - in_progress


@dataclass(frozen=True, slots=True)
class TokenInterval:
    """A request's time between streamed tokens as a line in how many other requests were
    decoding meanwhile, on its own replica and on the others: where the serving path's
    per-token work is done (per replica, or shared by the whole machine)."""

    alone_s: float
    per_same_replica_s: float
    per_other_replica_s: float
    r2: float
    requests: int


def token_interval(requests: Sequence[ServedRequest]) -> TokenInterval:
    """Least squares over every request with at least two tokens after its first: its
    mean interval against the time-weighted count of others decoding on its replica and
    on other replicas during its stretch (requests of different runs never overlap: their
    clocks are apart)."""
    rows, ys = [], []
    for r in requests:
        span = r.end - r.first_token
        if r.output_tokens < 3 or span <= 0:
            continue
        same = other = 0.0
        for o in requests:
            if o is r:
                continue
            share = _overlap(r.first_token, r.end, o.first_token, o.end) / span
            if o.replica == r.replica:
                same += share
            else:
                other += share
        rows.append((1.0, same, other))
        ys.append(span / (r.output_tokens - 1))
    if len(rows) < 3:
        raise ValueError("fewer than 3 requests with a decode stretch")
    a, y = np.asarray(rows), np.asarray(ys)
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    residual = y - a @ coef
    total = float(((y - y.mean()) ** 2).sum())
    r2 = 1 - float((residual**2).sum()) / total if total > 0 else 1.0
    return TokenInterval(float(coef[0]), float(coef[1]), float(coef[2]), r2, len(ys))
