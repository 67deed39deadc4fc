"""Check the simulator against a real vLLM replica, and fit its cost model from one.

``fit``: probe a live replica with prompts of random token ids (nothing cached), streamed,
and read each phase's duration: a cold prefill (time to first token) and the decode that
follows (first to last token), alone and with several sequences decoding together. Each
phase is a known sum of engine steps, so its duration is linear in the cost model's four
coefficients (steps, prefill tokens, decoding sequences, attended tokens); a non-negative
least-squares fit over the phases gives them.

The serving path's terms, fitted from a Locust run's request log, are in
``offline.sim.serving_path``.

``replay_on_replica``: the measured side of a calibration cell. The same sessions the
simulator runs (same trajectories in the same order, same rendered prompt ids, same output
lengths, no think time, the same concurrency) are sent to the replica as token-id
completions, and its own ``vllm:prefix_cache_*`` counters give the prefix-hit rate, exactly
as the simulator reports it.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import numpy as np

from gateway.sse import DONE, SSEReader
from offline.sim.cluster import session_order
from offline.sim.serving_path import ServedRequest
from offline.sim.workload import Workload
from router.cost import CostModel
from router.metrics import parse_vllm_metrics

# Token ids to draw random prompts from: ordinary vocabulary entries of the Qwen3.6
# vocabulary the tiny model uses (its specials start at 248,044).
_PROMPT_IDS = (1_000, 150_000)


@dataclass(frozen=True, slots=True)
class Phase:
    """One measured stretch of engine steps and what they computed."""

    steps: float
    prefill_tokens: float
    decode_seqs: float
    attended_tokens: float
    seconds: float

    @property
    def features(self) -> list[float]:
        return [self.steps, self.prefill_tokens, self.decode_seqs, self.attended_tokens]


def prefill_phase(prompt: int, budget: int, seconds: float) -> Phase:
    """A cold prompt alone: chunks of at most ``budget`` tokens, each attending to all
    tokens computed so far."""
    steps, attended, done = 0, 0, 0
    while done < prompt:
        done = min(prompt, done + budget)
        steps += 1
        attended += done
    return Phase(steps, prompt, 0, attended, seconds)


def decode_phase(prompt: int, seqs: int, tokens: int, seconds: float) -> Phase:
    """``seqs`` sequences of ``prompt`` tokens decoding ``tokens`` steps together."""
    attended = seqs * sum(prompt + j for j in range(1, tokens + 1))
    return Phase(tokens, 0, seqs * tokens, attended, seconds)


def fit_coefficients(phases: Sequence[Phase]) -> tuple[float, float, float, float]:
    """Non-negative least squares over the phases (per step, per prefill token, per
    decoding sequence, per attended token), fitted in relative error so short phases
    count as much as long ones."""
    a = np.array([p.features for p in phases], dtype=float)
    y = np.array([p.seconds for p in phases], dtype=float)
    weights = 1 / np.maximum(y, 1e-6)
    a, y = a * weights[:, None], y * weights
    active = list(range(a.shape[1]))
    coef = np.zeros(a.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(a[:, active], y, rcond=None)
        if (sol >= 0).all():
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))  # drop the most negative term and refit
    return tuple(float(c) for c in coef)  # type: ignore[return-value]


def fitted(base: CostModel, coefficients: Sequence[float], name: str | None = None) -> CostModel:
    step, prefill, decode, attended = coefficients
    return replace(
        base,
        name=name or base.name,
        per_step_s=step,
        per_prefill_token_s=prefill,
        per_decode_seq_s=decode,
        per_attended_token_s=attended,
    )


async def _stream(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    prompt: list[int],
    max_tokens: int,
    cache_salt: str | None = None,
    usage: dict[str, Any] | None = None,
) -> list[float]:
    """Send a completion of token ids; the arrival time of every streamed token.
    ``cache_salt`` (vLLM's) keeps the request's cached blocks apart from other salts';
    ``usage``, when given, receives the reply's usage."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "min_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if cache_salt is not None:
        body["cache_salt"] = cache_salt
    times: list[float] = []
    async with session.post(f"{url}/v1/completions", json=body) as resp:
        resp.raise_for_status()
        reader = SSEReader()
        async for raw in resp.content:
            event = reader.line(raw)
            if event is None or event.data == DONE:
                continue
            chunk = json.loads(event.data)
            if chunk.get("choices") and chunk["choices"][0].get("text") is not None:
                times.append(time.perf_counter())
            if usage is not None and chunk.get("usage"):
                usage.update(chunk["usage"])
    return times


async def measure_phases(
    url: str,
    model: str,
    budget: int,
    *,
    prompt_sizes: Sequence[int] = (128, 512, 2048, 6000),
    output_tokens: int = 24,
    batch_sizes: Sequence[int] = (1, 4),
    repeats: int = 3,
    seed: int = 0,
) -> list[Phase]:
    """Probe the replica: for each prompt size and batch size, cold prompts decoded
    together. Returns a prefill phase per lone request and a decode phase per batch.

    Each probe runs ``repeats`` times with fresh prompts and keeps its fastest run: what
    else runs on the machine only ever adds time to a phase, so the fastest is the closest
    to the engine's own cost."""
    rng = random.Random(seed)
    phases: list[Phase] = []
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await _stream(session, url, model, [rng.randrange(*_PROMPT_IDS) for _ in range(64)], 2)
        for prompt in prompt_sizes:
            for seqs in batch_sizes:
                prefills: list[Phase] = []
                decodes: list[Phase] = []
                for _ in range(max(1, repeats)):
                    prefill, decode = await _probe_once(
                        session, url, model, budget, rng, prompt, seqs, output_tokens
                    )
                    prefills += [prefill] if prefill else []
                    decodes += [decode] if decode else []
                if prefills:
                    phases.append(min(prefills, key=lambda p: p.seconds))
                if decodes:  # runs may decode a different number of steps together
                    phases.append(min(decodes, key=lambda p: p.seconds / p.steps))
    return phases


async def _probe_once(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    budget: int,
    rng: random.Random,
    prompt: int,
    seqs: int,
    output_tokens: int,
) -> tuple[Phase | None, Phase | None]:
    """``seqs`` cold prompts of ``prompt`` tokens sent together: the prefill phase (a lone
    request only) and the phase they decoded together (when they overlapped two steps)."""
    prompts = [[rng.randrange(*_PROMPT_IDS) for _ in range(prompt)] for _ in range(seqs)]
    sent = time.perf_counter()
    runs = await asyncio.gather(*(_stream(session, url, model, p, output_tokens) for p in prompts))
    prefill = prefill_phase(prompt, budget, runs[0][0] - sent) if seqs == 1 else None
    # Decode together from when the last of them got its first token.
    start = max(r[0] for r in runs)
    end = min(r[-1] for r in runs)
    together = min(sum(1 for t in r if start < t <= end) for r in runs)
    decode = decode_phase(prompt, seqs, together, end - start) if together >= 2 else None
    return prefill, decode


@dataclass(frozen=True, slots=True)
class MeasuredCell:
    strategy: str
    requests: int
    prefix_queries: float
    prefix_hits: float
    seconds: float
    served: tuple[ServedRequest, ...]

    @property
    def hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0


async def _counters(session: aiohttp.ClientSession, url: str) -> tuple[float, float]:
    async with session.get(f"{url}/metrics") as resp:
        m = parse_vllm_metrics(await resp.text())
    return m.prefix_cache_queries or 0.0, m.prefix_cache_hits or 0.0


async def replay_on_replica(
    url: str,
    model: str,
    workload: Workload,
    strategy: str,
    *,
    sessions: int,
    concurrency: int,
    seed: int = 0,
) -> MeasuredCell:
    """Run the sessions the simulator would run (``SimConfig(sessions=..., concurrency=...,
    think_s=0, seed=...)``) against one real replica; the replica's prefix counters.

    The cell's requests carry a fresh ``cache_salt``, so like the simulated cell it starts
    from a cold cache: blocks an earlier cell left on the replica do not count."""
    salt = uuid.uuid4().hex
    if workload.share != "all" or any(
        st.tokens is None for r in workload.runs.values() for st in r.steps
    ):
        raise ValueError(
            "replaying on a replica needs a workload built with share='all' and keep_tokens: "
            "the replica shares whatever prompts are equal, and needs their token ids"
        )
    order = session_order(workload, seed)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for s in range(sessions):
        queue.put_nowait(s)
    served: list[ServedRequest] = []

    async def session_runner(client: aiohttp.ClientSession) -> None:
        while not queue.empty():
            s = queue.get_nowait()
            run = workload.runs[(order[s % len(order)], strategy)]
            for step in run.steps:
                assert step.tokens is not None
                usage: dict[str, Any] = {}
                sent = time.perf_counter()
                times = await _stream(
                    client, url, model, step.tokens.tolist(), step.output_tokens, salt, usage
                )
                details = usage.get("prompt_tokens_details") or {}
                served.append(
                    ServedRequest(
                        replica=url,
                        start=sent,
                        first_token=times[0],
                        end=times[-1],
                        prompt_tokens=int(usage.get("prompt_tokens", len(step.tokens))),
                        cached_tokens=int(details.get("cached_tokens") or 0),
                        output_tokens=len(times),
                    )
                )

    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(timeout=timeout) as client:
        q0, h0 = await _counters(client, url)
        started = time.perf_counter()
        await asyncio.gather(*(session_runner(client) for _ in range(concurrency)))
        seconds = time.perf_counter() - started
        q1, h1 = await _counters(client, url)
    return MeasuredCell(strategy, len(served), q1 - q0, h1 - h0, seconds, tuple(served))


def cells_agree(simulated: float, measured: float, points: float = 5.0) -> bool:
    """The calibration criterion: hit rates within ``points`` percentage points."""
    return math.isfinite(simulated) and abs(100 * simulated - 100 * measured) <= points
