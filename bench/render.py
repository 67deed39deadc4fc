"""Render cost per request, early and late in the longest recorded session.

For each strategy: render requests 0..t-1 in order passing the renderer cache along, then
time the render of request t many times, each from the cache of request t-1, and print the
median at t = 30 and t = 300 (or the last request, when the session is shorter) and their
ratio. An incremental renderer keeps that ratio near 1; one that re-renders everything
grows with the history. The cache must survive being rendered from: if a timed render
mutates it, or repeated renders disagree, the table says so.

The last column is the gateway's context guard (``Renderers.bounded``: the strategy under a
cliff at ``--budget``, in the gateway's token estimate): request t=late rendered under a
limit one token lower, from the cache the old limit left, as when a session's calibration
moves its limit.

    .venv/bin/python bench/render.py [PATH ...] [--strategy base,refold,...]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gateway.fold import STRATEGIES, make_renderer
from gateway.fold.bound import Renderers
from gateway.fold.renderer import Renderer, step_indices
from gateway.tokens import ChatTokenizer, default_tokenizer_spec, get_counter
from gateway.transcript import Transcript
from offline.importers import Trajectory, load_trajectories
from offline.replay import requests_of

DEFAULT_PATH = Path(__file__).resolve().parent.parent / ".." / "shared" / "trajectories" / "norm"
MIN_REPEATS, MAX_REPEATS, TIME_PER_POINT_S = 5, 200, 1.0


def longest(trajectories: Sequence[Trajectory]) -> Trajectory:
    return max(trajectories, key=lambda t: len(step_indices(t.transcript)))


def warm_cache(renderer: Renderer, requests: Sequence[Transcript], t: int) -> Any:
    """The cache after rendering requests 0..t-1 in order."""
    cache = None
    for request in requests[:t]:
        cache = renderer.render(request, None, cache).cache
    return cache


def fingerprint(obj: Any) -> Any:
    """A hashable value snapshot of ``obj`` (dataclasses and containers walked; callables by
    identity), so a mutation shows even in classes that compare by identity."""
    if obj is None or isinstance(obj, str | bytes | int | float | bool):
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = tuple(fingerprint(getattr(obj, f.name)) for f in dataclasses.fields(obj))
        return (type(obj).__name__, fields)
    if isinstance(obj, list | tuple):
        return (type(obj).__name__, tuple(fingerprint(x) for x in obj))
    if isinstance(obj, Mapping):
        return ("map", tuple((fingerprint(k), fingerprint(v)) for k, v in obj.items()))
    if isinstance(obj, set | frozenset):
        return ("set", frozenset(fingerprint(x) for x in obj))
    if callable(obj):
        # A bound method is a new object on every attribute access: name its parts.
        return ("callable", id(getattr(obj, "__self__", None)), id(getattr(obj, "__func__", obj)))
    return (type(obj).__name__, fingerprint(_state_of(obj)))


def _state_of(obj: Any) -> dict[str, Any]:
    state = getattr(obj, "__dict__", None)
    if state is None:
        slots = getattr(type(obj), "__slots__", ())
        state = {name: getattr(obj, name) for name in slots if hasattr(obj, name)}
    return state


def frozen_objects(obj: Any, found: dict[int, object] | None = None) -> dict[int, object]:
    """Every frozen dataclass instance reachable from ``obj`` (by id): immutable, so a copy
    of a cache may share them, keeping the identity fast paths renderers rely on."""
    found = {} if found is None else found
    if obj is None or isinstance(obj, str | bytes | int | float | bool) or callable(obj):
        return found
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        if type(obj).__dataclass_params__.frozen:  # type: ignore[attr-defined]
            found[id(obj)] = obj
            return found
        children: Any = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    elif isinstance(obj, Mapping):
        children = [*obj.keys(), *obj.values()]
    elif isinstance(obj, list | tuple | set | frozenset):
        children = obj
    else:
        children = list(_state_of(obj).values())
    for child in children:
        frozen_objects(child, found)
    return found


def time_render(
    renderer: Renderer, request: Transcript, cache: Any, shared: Sequence[object]
) -> tuple[float, str]:
    """Median seconds of rendering ``request`` from ``cache``, and a problem note or ''.

    Every timed render gets its own deep copy of ``cache`` (made outside the timer), so a
    renderer that updates its cache in place is still timed from the state after request
    t-1. ``shared`` objects (the tokenizer) and immutable messages are shared, never copied.
    """

    def copy_of(value: Any) -> Any:
        return copy.deepcopy(value, frozen_objects(value, {id(o): o for o in shared}))

    pristine = copy_of(cache)
    before = fingerprint(cache)
    first = renderer.render(request, None, cache).transcript
    problems = []
    if fingerprint(cache) != before:
        problems.append("render mutates its input cache (timed from copies)")
    samples: list[float] = []
    consistent = True
    budget_end = time.perf_counter() + TIME_PER_POINT_S
    while len(samples) < MIN_REPEATS or (
        len(samples) < MAX_REPEATS and time.perf_counter() < budget_end
    ):
        own = copy_of(pristine)
        start = time.perf_counter()
        out = renderer.render(request, None, own)
        samples.append(time.perf_counter() - start)
        consistent = consistent and out.transcript == first
    if not consistent:
        problems.append("renders from equal caches differ")
    return statistics.median(samples), "; ".join(problems)


def guard_limit_moved(spec: str, requests: Sequence[Transcript], t: int, limit: int) -> float:
    """Median seconds of the guard's rendering of request ``t`` under ``limit - 1``, from
    the cache its rendering under ``limit`` left after request t-1."""
    renderers = Renderers()
    before = renderers.bounded("bench", spec, None, limit)
    after = renderers.bounded("bench", spec, None, limit - 1)
    cache = warm_cache(before, requests, t)
    return time_render(after, requests[t], cache, (before, after))[0]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", type=Path, default=[DEFAULT_PATH])
    parser.add_argument("--strategy", default=",".join(STRATEGIES))
    parser.add_argument("--tokenizer", default=default_tokenizer_spec())
    parser.add_argument("--budget", type=int, default=32_000, help="cliff's threshold")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--early", type=int, default=30)
    parser.add_argument("--late", type=int, default=300)
    args = parser.parse_args(argv)

    missing = [p for p in args.paths if not p.exists()]
    if missing:
        parser.error(f"no such trajectory path: {', '.join(map(str, missing))}")
    trajectory = longest(load_trajectories(*args.paths))
    requests = list(requests_of(trajectory.transcript, trajectory.compaction_indices))
    if not requests:
        parser.error(f"{trajectory.id} has no assistant replies to replay")
    chat = ChatTokenizer(get_counter(args.tokenizer))
    points = sorted({min(args.early, len(requests) - 1), min(args.late, len(requests) - 1)})
    console = Console() if sys.stdout.isatty() else Console(width=120)
    console.print(
        f"{trajectory.id}: {len(step_indices(trajectory.transcript))} steps, "
        f"{len(requests)} requests; tokenizer {chat.counter.name}"
    )
    table = Table(title="median render time per request, warm cache", title_justify="left")
    late = points[-1]
    headers = ("strategy", *(f"request {t} (ms)" for t in points), "ratio", "cache check")
    for header in (*headers, f"request {late}, guard's limit moved (ms)"):
        table.add_column(header, justify="left" if header == "strategy" else "right")
    for spec in args.strategy.split(","):
        try:
            renderer = make_renderer(
                spec, k=args.k, budget=args.budget, count_tokens=chat.message_count
            )
        except (ValueError, ImportError) as exc:
            table.add_row(spec, *["-"] * len(points), "-", f"not built: {exc}")
            continue
        medians, notes = [], []
        for t in points:
            cache = warm_cache(renderer, requests, t)
            median, problem = time_render(renderer, requests[t], cache, (chat, renderer))
            medians.append(median)
            notes.append(problem)
        ratio = medians[-1] / medians[0] if medians[0] else float("nan")
        note = "; ".join(sorted({n for n in notes if n})) or "ok"
        moved = guard_limit_moved(spec, requests, late, args.budget)
        table.add_row(
            spec,
            *(f"{m * 1000:.3f}" for m in medians),
            f"{ratio:.1f}x",
            note,
            f"{moved * 1000:.3f}",
        )
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
